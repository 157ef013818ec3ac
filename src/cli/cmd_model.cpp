#include <cstdio>
#include <nlohmann/json.hpp>

#include "src/cli/command.hpp"
#include "stratagem/interop.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/limits.hpp"
#include "stratagem/output_file.hpp"
#include "stratagem/spec_json.hpp"
#include "stratagem/workload.hpp"

namespace stratagem::cli {
namespace {

std::string mtp_note(const ModelSpec& m) {
  return std::to_string(m.mtp_modules) +
         " multi-token-prediction module(s) of the published model: not in these counts, and not "
         "modelled by the forecast or the runtime";
}

nlohmann::json model_summary(const ModelSpec& m) {
  nlohmann::json j = to_json(m);
  j["parameters"] = m.parameters();
  // The names the MoE issue (#26) asks for; equal to parameters for a dense model.
  j["total_params"] = m.parameters();
  j["active_params"] = m.active_parameters();
  j["layer_parameters"] = m.layer_parameters();  // a dense layer's
  j["embedding_parameters"] = m.embedding_parameters();
  j["head_parameters"] = m.head_parameters();
  j["flops_per_token"] = m.flops_per_token();
  j["kv_cache_bytes_per_token"] = 2 * m.kv_cache_elements_per_token();  // bf16
  j["flops_formula"] = "3 x (2 x GEMM weights + 4 s h) per layer + 6 V h, per token (Megatron)";
  if (m.attention == AttentionKind::mla) {
    j["attention_parameters"] = m.attention_parameters();
    j["flops_formula"] =
        "3 x (2 x GEMM weights + 2 s heads (qk head dim + v head dim)) per layer + 6 V h, per "
        "token (Megatron, over all s x s positions)";
  }
  if (m.moe.enabled()) {
    j["moe_layer_parameters"] = m.layer_parameters(m.moe.dense_layers);
    j["expert_parameters"] = m.expert_parameters();
    j["router_parameters"] = m.router_parameters();
    j["flops_formula"] = j["flops_formula"].get<std::string>() +
                         "; MoE layers count the top_k routed and the shared experts, not the "
                         "router (Megatron)";
  }
  if (m.mtp_modules > 0) j["left_out"] = mtp_note(m);
  return j;
}

void print_model(const ModelSpec& m);

int run_model_show(Args& a) {
  const bool json = a.flag("--json");
  // The name may come positionally or through the shared --model flag (with overrides): parse
  // the flags first so that their values are not taken for positional names.
  ModelSpec m;
  const bool has_flags =
      a.value("--model") || a.value("--layers") || a.value("--hidden") || a.value("--experts");
  if (has_flags) {
    m = model_from_args(a);
    if (!a.positionals().empty())
      throw InputError(a.command() + ": give the model by name or by flags, not both");
  } else {
    auto pos = a.positionals();
    if (pos.size() != 1) throw InputError(a.command() + ": expected one model NAME|FILE.json");
    Args shared(a.command(), {"--model", pos[0]});
    m = model_from_args(shared);
  }
  a.finish();
  if (json) {
    print_json(model_summary(m));
    return 0;
  }
  print_model(m);
  return 0;
}

int run_model_import(Args& a) {
  const bool json = a.flag("--json");
  auto out = a.output("-o");
  auto seq_len = a.int_value("--seq-len", 1, limits::kMaxDim);
  auto pos = a.positionals();
  a.finish();
  if (pos.size() != 1) throw InputError(a.command() + ": expected one Hugging Face config.json");
  const nlohmann::json config = io::read_json_file(pos[0]);
  if (!interop::is_hf_config(config))
    throw InputError(pos[0] + ": not a Hugging Face config (no 'architectures' or 'model_type')");
  const ModelSpec m = interop::model_from_hf_config(config, pos[0], seq_len);
  const auto notes = interop::hf_import_notes(config);
  nlohmann::json model = to_json(m);
  model["source"] = "imported from " + pos[0] + " (" +
                    config["architectures"][0].get<std::string>() + ") by stratagem model import";
  if (out && world_rank() == 0) io::write_output("-o", *out, model.dump(2) + "\n");
  if (json) {
    nlohmann::json j = model_summary(m);
    j["notes"] = notes;
    print_json(j);
    return 0;
  }
  if (world_rank() != 0) return 0;
  print_model(m);
  for (const auto& n : notes) std::printf("  note: %s\n", n.c_str());
  if (out) std::printf("wrote %s\n", out->c_str());
  return 0;
}

Register reg_import{
    {"model import", "read a Hugging Face config.json into a stratagem model",
     "usage: stratagem model import CONFIG.json [-o model.json] [--seq-len N] [--json]\n"
     "  architectures: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel,\n"
     "  GPTNeoXForCausalLM, MixtralForCausalLM, DeepseekV2ForCausalLM, DeepseekV3ForCausalLM\n"
     "  (--model CONFIG.json reads the same file wherever a model is taken)\n"
     "  --seq-len N   the training sequence length [the config's max_position_embeddings]\n",
     run_model_import}};

void print_model(const ModelSpec& m) {
  if (world_rank() != 0) return;
  std::printf("%s: %s, %d layers, hidden %d, %d heads (%d kv), ffn %d, vocab %d, seq %d\n",
              m.name.c_str(), to_string(m.arch), m.layers, m.hidden, m.heads, m.kv_heads,
              m.ffn_hidden, m.vocab, m.seq_len);
  std::printf("  %s, %s, %s positions, %s embeddings\n", to_string(m.norm), to_string(m.activation),
              to_string(m.position), m.tied_embeddings ? "tied" : "untied");
  if (m.attention == AttentionKind::mla)
    std::printf(
        "  MLA attention: q_lora_rank %d, kv_lora_rank %d, qk head dim %d + %d (RoPE), v %d\n",
        m.mla.q_lora_rank, m.mla.kv_lora_rank, m.mla.qk_nope_head_dim, m.mla.qk_rope_head_dim,
        m.mla.v_head_dim);
  if (m.moe.enabled())
    std::printf(
        "  MoE: %d experts of ffn %d, top %d, %d shared, %d dense layers, %s router, aux loss %g\n",
        m.moe.experts, m.moe.expert_ffn_hidden, m.moe.top_k, m.moe.shared_experts,
        m.moe.dense_layers, to_string(m.moe.router_score), m.moe.aux_loss_coeff);
  std::printf("  parameters       %.4g (%.3fB)\n", double(m.parameters()), m.parameters() / 1e9);
  if (m.moe.enabled()) {
    std::printf("    active         %.4g (%.3fB per token)\n", double(m.active_parameters()),
                m.active_parameters() / 1e9);
    if (m.moe.dense_layers > 0)
      std::printf("    per dense layer %lld (layers 0-%d)\n", (long long)m.layer_parameters(),
                  m.moe.dense_layers - 1);
    std::printf("    per MoE layer  %lld (each expert %lld, router %lld)\n",
                (long long)m.layer_parameters(m.moe.dense_layers), (long long)m.expert_parameters(),
                (long long)m.router_parameters());
  } else {
    std::printf("    per layer      %lld\n", (long long)m.layer_parameters());
  }
  std::printf("    embeddings     %lld\n", (long long)m.embedding_parameters());
  std::printf("    head           %lld\n", (long long)m.head_parameters());
  std::printf("  flops_per_token  %.4g (model FLOPs, forward+backward, Megatron count%s)\n",
              m.flops_per_token(), m.moe.enabled() ? ", active experts" : "");
  std::printf("  kv cache         %lld bytes per token (bf16, all layers)\n",
              (long long)(2 * m.kv_cache_elements_per_token()));
  if (m.mtp_modules > 0) std::printf("  left out: %s\n", mtp_note(m).c_str());
}

Register reg{{"model show", "parameters and FLOPs per token of a model",
              std::string("usage: stratagem model show NAME|FILE.json [--json]\n"
                          "       stratagem model show --model NAME [overrides] [--json]\n") +
                  kModelHelp,
              run_model_show}};

}  // namespace
}  // namespace stratagem::cli
