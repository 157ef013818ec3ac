// Mixture-of-Experts and Multi-head Latent Attention in the model: the JSON sections and their
// errors, total and active parameters against the published figures, FLOPs per token and MLA's
// counts against hand computations, and MLA's work in the workload rules.
#define BOOST_TEST_MODULE moe_model
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <nlohmann/json.hpp>

#include "stratagem/error.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/model.hpp"
#include "stratagem/spec_json.hpp"
#include "stratagem/workload.hpp"
#include "test/support/input_error.hpp"

using namespace stratagem;
using stratagem::test::input_error;

namespace {

double relative(double a, double b) {
  return std::abs(a - b) / b;
}

// A small MoE decoder: hidden 64, 4 heads, 4 layers of which the first is dense.
nlohmann::json tiny_moe() {
  return nlohmann::json::parse(R"({
    "name": "tiny-moe", "layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 192,
    "vocab": 256, "seq_len": 32, "norm": "rmsnorm", "activation": "swiglu", "position": "rope",
    "tied_embeddings": false, "bias": false, "dropout": false,
    "moe": {"experts": 8, "top_k": 2, "expert_ffn_hidden": 48, "shared_experts": 1,
            "dense_layers": 1, "router_score": "sigmoid", "aux_loss_coeff": 0.01}
  })");
}

// A small MLA decoder (DeepSeek-V3's structure at toy sizes).
nlohmann::json tiny_mla() {
  return nlohmann::json::parse(R"({
    "name": "tiny-mla", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128,
    "vocab": 256, "seq_len": 32, "norm": "rmsnorm", "activation": "swiglu", "position": "rope",
    "tied_embeddings": false, "bias": false, "dropout": false, "attention": "mla",
    "mla": {"q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
            "v_head_dim": 8}
  })");
}

std::string error_of(const nlohmann::json& j) {
  return input_error([&] { model_from_json(j, "m.json"); });
}

}  // namespace

BOOST_AUTO_TEST_CASE(builtin_moe_models_match_published_totals_and_active_parameters) {
  // Issue #26's acceptance: Mixtral 8x7B 46.7B total and 12.9B active within 1%; DeepSeek-V3
  // 671B and 37B within 2%, without its multi-token-prediction module.
  const ModelSpec mixtral = load_model("mixtral-8x7b");
  BOOST_TEST(relative(double(mixtral.parameters()), 46.7e9) < 0.01, mixtral.parameters());
  BOOST_TEST(relative(double(mixtral.active_parameters()), 12.9e9) < 0.01,
             mixtral.active_parameters());
  const ModelSpec v3 = load_model("deepseek-v3");
  BOOST_TEST(relative(double(v3.parameters()), 671e9) < 0.02, v3.parameters());
  BOOST_TEST(relative(double(v3.active_parameters()), 37e9) < 0.02, v3.active_parameters());
  BOOST_TEST(v3.mtp_modules == 1);
  BOOST_TEST((v3.attention == AttentionKind::mla));
  BOOST_TEST(v3.moe.dense_layers == 3);
  // DeepSeek's MLA keeps kv_lora_rank + qk_rope_head_dim = 576 elements per token and layer:
  // 61 x 576 x 2 bytes = 70,272 bytes in bf16, the figure of Zhao et al. (arXiv:2505.09343,
  // Table 1: "70.272 KB" per token).
  BOOST_TEST(2 * v3.kv_cache_elements_per_token() == 70272);
  // Mixtral's GQA: 32 layers x 2 x 8 heads x 128 = 65,536 elements.
  BOOST_TEST(mixtral.kv_cache_elements_per_token() == 65536);
}

BOOST_AUTO_TEST_CASE(moe_parameters_count_every_expert_and_active_ones_top_k) {
  const ModelSpec m = model_from_json(tiny_moe(), "tiny");
  const int64_t h = 64, kv = 32, f = 192, fe = 48, V = 256;
  const int64_t attention = h * (h + 2 * kv) + h * h + h;  // qkv, out, the norm
  const int64_t dense_ffn = 3 * h * f + h;
  const int64_t expert = 3 * h * fe;
  const int64_t router = 8 * h;
  const int64_t moe_ffn = (8 + 1) * expert + router + h;
  BOOST_TEST(m.attention_parameters() == attention);
  BOOST_TEST(m.expert_parameters() == expert);
  BOOST_TEST(m.router_parameters() == router);
  BOOST_TEST(m.layer_parameters() == attention + dense_ffn);
  BOOST_TEST(m.layer_parameters(0) == attention + dense_ffn);
  for (int l = 1; l < 4; ++l) BOOST_TEST(m.layer_parameters(l) == attention + moe_ffn);
  const int64_t total = (attention + dense_ffn) + 3 * (attention + moe_ffn) + V * h + (V * h + h);
  BOOST_TEST(m.parameters() == total);
  // A token passes through top_k = 2 of the 8 routed experts (and the shared one).
  BOOST_TEST(m.active_parameters() == total - 3 * (8 - 2) * expert);
  // Dense models: every layer the same, all parameters active.
  const ModelSpec dense = load_model("llama3-8b");
  BOOST_TEST(dense.layer_parameters(5) == dense.layer_parameters());
  BOOST_TEST(dense.active_parameters() == dense.parameters());
}

BOOST_AUTO_TEST_CASE(moe_flops_per_token_counts_the_active_experts_as_megatron_does) {
  const ModelSpec m = model_from_json(tiny_moe(), "tiny");
  const double h = 64, kv = 32, f = 192, fe = 48, s = 32, V = 256;
  const double attention_gemm = h * (h + 2 * kv) + h * h;
  const double dense_layer = 3 * (2 * (attention_gemm + 3 * h * f) + 4 * s * h);
  // Megatron (training.py num_floating_point_operations): the top_k routed experts and the
  // shared ones; the router is not counted.
  const double moe_layer = 3 * (2 * (attention_gemm + (2 + 1) * 3 * h * fe) + 4 * s * h);
  const double expected = dense_layer + 3 * moe_layer + 6 * V * h;
  BOOST_TEST(relative(m.flops_per_token(), expected) < 1e-12);
  // DeepSeek-V3: its authors count 250 GFLOPs of training per token at a 4096-token sequence
  // (Zhao et al., arXiv:2505.09343, Table 2), with the causal mask halving the attention core;
  // this count takes the core over all s x s positions, so half of it comes off to compare.
  const ModelSpec v3 = load_model("deepseek-v3");
  const double core = 3.0 * 2 * 4096 * 128 * (192 + 128) * v3.layers;
  BOOST_TEST(v3.seq_len == 4096);
  BOOST_TEST(relative(v3.flops_per_token() - core / 2, 250e9) < 0.01, v3.flops_per_token());
  // Mixtral: about 6 FLOPs per active parameter outside the embeddings, plus attention.
  const ModelSpec mixtral = load_model("mixtral-8x7b");
  const double six_n = 6.0 * double(mixtral.active_parameters() - mixtral.embedding_parameters());
  BOOST_TEST(mixtral.flops_per_token() > six_n);
  BOOST_TEST(mixtral.flops_per_token() < 1.2 * six_n);
}

BOOST_AUTO_TEST_CASE(mla_parameters_flops_and_kv_cache_by_hand) {
  const ModelSpec m = model_from_json(tiny_mla(), "tiny");
  // h 64, heads 4, q_lora 16, kv_lora 8, nope 8, rope 4, v 8:
  //   q_a 64x16 = 1024, its norm 16, q_b 16 x 4(8+4) = 768,
  //   kv_a 64 x (8+4) = 768, its norm 8, kv_b 8 x 4(8+8) = 512,
  //   o 4x8 x 64 = 2048, the input norm 64.
  BOOST_TEST(m.attention_parameters() == 1024 + 16 + 768 + 768 + 8 + 512 + 2048 + 64);
  const int64_t ffn = 3 * 64 * 128 + 64;
  BOOST_TEST(m.layer_parameters() == 5208 + ffn);
  BOOST_TEST(m.parameters() == 2 * (5208 + ffn) + 256 * 64 + 256 * 64 + 64);
  // FLOPs: the GEMM weights (no norms) 1024 + 768 + 768 + 512 + 2048 = 5120; attention over
  // 32 x 32 positions with the qk head width 12 and v head width 8: 2 s heads (12 + 8) = 5120.
  const double layer = 3 * (2 * (5120.0 + 3 * 64 * 128) + 2 * 32 * 4 * (12 + 8));
  BOOST_TEST(relative(m.flops_per_token(), 2 * layer + 6 * 256 * 64) < 1e-12);
  // KV cache: the latent and the RoPE key, 8 + 4 per layer.
  BOOST_TEST(m.kv_cache_elements_per_token() == 2 * 12);
  // Without query compression: one q_proj of 64 x 4(8+4) = 3072 in place of 1024 + 16 + 768.
  nlohmann::json j = tiny_mla();
  j["mla"]["q_lora_rank"] = 0;
  BOOST_TEST(model_from_json(j, "tiny").attention_parameters() == 3072 + 768 + 8 + 512 + 2048 + 64);
}

BOOST_AUTO_TEST_CASE(mla_work_is_its_gemms_and_attention_at_tp1_and_refused_at_tp2) {
  const ModelSpec m = model_from_json(tiny_mla(), "tiny");
  LayerStrategy st;  // tp 1
  const int samples = 2;
  const double T = samples * 32.0;
  const BlockWork w = forward_work(m, st, Block::attention, samples, true);
  BOOST_TEST(w.num_gemms == 5);  // q_a, q_b, kv_a, kv_b, o
  BOOST_TEST(relative(w.gemm_flops(), 2 * T * 5120) < 1e-12);
  BOOST_TEST(relative(w.attention_flops, T * 2 * 32 * 4 * (12 + 8)) < 1e-12);
  // The Program's forward FLOPs of a layer are a third of the model FLOPs of its tokens.
  const BlockWork mlp = forward_work(m, st, Block::mlp, samples, true);
  const double per_layer_forward = w.flops() + mlp.flops();
  BOOST_TEST(relative(3 * per_layer_forward * 2 + 6.0 * 256 * 64 * T,
                      model_flops_per_iteration(m, samples)) < 1e-12);
  // Backward: a data and a weight gradient per forward GEMM, twice the attention core.
  const BlockWork back = backward_work(m, st, Block::attention, samples, true);
  BOOST_TEST(back.num_gemms == 10);
  BOOST_TEST(relative(back.flops(), 2 * w.flops()) < 1e-12);
  BOOST_TEST(block_parameters_per_rank(m, 1, Block::attention) == m.attention_parameters());
  // Saved for backward (bf16, flash): norm input and projection input 2 x 64, the query
  // latent twice 2 x 16, the KV latent with the RoPE key 12 and the normed latent 8, Q and K
  // 2 x 4 x 12, V 4 x 8, the attention output 4 x 8 per token; the softmax statistics.
  const int64_t per_token = 2 * 64 + 2 * 16 + 12 + 8 + 2 * 48 + 32 + 32;
  BOOST_TEST(saved_activation_bytes(m, st, Block::attention, samples, Recompute::none, true,
                                    Dtype::bf16) == 2 * int64_t(T) * per_token + 4 * 2 * 4 * 32);
  LayerStrategy tp2;
  tp2.tp = 2;
  const std::string e = input_error([&] { forward_work(m, tp2, Block::attention, samples, true); });
  BOOST_TEST(
      e.find("MLA attention with tp > 1 is not supported yet (issue #26)") != std::string::npos, e);
}

BOOST_AUTO_TEST_CASE(moe_and_mla_sections_round_trip_and_dense_json_is_unchanged) {
  const ModelSpec m = model_from_json(tiny_moe(), "tiny");
  BOOST_TEST(m.moe.experts == 8);
  BOOST_TEST(m.moe.top_k == 2);
  BOOST_TEST(m.moe.expert_ffn_hidden == 48);
  BOOST_TEST(m.moe.shared_experts == 1);
  BOOST_TEST(m.moe.dense_layers == 1);
  BOOST_TEST((m.moe.router_score == RouterScore::sigmoid));
  BOOST_TEST(m.moe.aux_loss_coeff == 0.01);
  const ModelSpec back = model_from_json(to_json(m), "again");
  BOOST_TEST((back.moe == m.moe));
  const ModelSpec v3 = load_model("deepseek-v3");
  const ModelSpec v3_back = model_from_json(to_json(v3), "again");
  BOOST_TEST((v3_back.mla == v3.mla));
  BOOST_TEST((v3_back.moe == v3.moe));
  BOOST_TEST(v3_back.mtp_modules == 1);
  BOOST_TEST(v3_back.parameters() == v3.parameters());
  // A dense model writes no attention, mla, moe or mtp_modules key (checkpoints and goldens
  // stay as they were).
  const nlohmann::json dense = to_json(load_model("llama3-8b"));
  for (const char* key : {"attention", "mla", "moe", "mtp_modules"})
    BOOST_TEST(!dense.contains(key), key);
  // expert_ffn_hidden defaults to ffn_hidden (Mixtral's experts are its dense FFN's width).
  nlohmann::json j = tiny_moe();
  j["moe"].erase("expert_ffn_hidden");
  BOOST_TEST(model_from_json(j, "tiny").moe.expert_ffn_hidden == 192);
}

BOOST_AUTO_TEST_CASE(bad_moe_sections_exit_2_naming_the_field) {
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* expected;
  };
  const Case cases[] = {
      {"top_k", 9, "field 'moe.top_k': expected at most experts (8)"},
      {"top_k", 0, "field 'moe.top_k'"},
      {"experts", 0, "field 'moe.experts'"},
      {"experts", -4, "field 'moe.experts'"},
      {"shared_experts", -1, "field 'moe.shared_experts'"},
      {"dense_layers", 5, "field 'moe.dense_layers'"},
      {"dense_layers", 4, "field 'moe.dense_layers': expected fewer than layers (4)"},
      {"dense_layers", -1, "field 'moe.dense_layers'"},
      {"expert_ffn_hidden", 0, "field 'moe.expert_ffn_hidden'"},
      {"aux_loss_coeff", -0.5, "field 'moe.aux_loss_coeff'"},
      {"router_score", "relu", "field 'moe.router_score'"},
      {"expert_groups", 3, "field 'moe.expert_groups': expected a divisor of experts (8)"},
      {"capacity", 1.25, "field 'moe.capacity': unknown field"},
  };
  for (const auto& c : cases) {
    nlohmann::json j = tiny_moe();
    j["moe"][c.key] = c.value;
    const std::string e = error_of(j);
    BOOST_TEST(e.find(c.expected) != std::string::npos, c.key << " " << c.value << ": " << e);
    BOOST_TEST(e.find("m.json") == 0, e);
  }
  nlohmann::json missing = tiny_moe();
  missing["moe"].erase("top_k");
  BOOST_TEST(error_of(missing).find("field 'moe.top_k': missing") != std::string::npos);
  nlohmann::json groups = tiny_moe();
  groups["moe"]["expert_groups"] = 4;  // 2 experts each
  groups["moe"]["group_top_k"] = 1;    // at most 2 experts reachable: top_k 2 fits
  BOOST_TEST(error_of(groups).empty());
  groups["moe"]["top_k"] = 3;
  BOOST_TEST(error_of(groups).find("field 'moe.top_k': expected at most group_top_k") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(bad_mla_sections_exit_2_naming_the_field) {
  for (const char* key :
       {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"}) {
    nlohmann::json j = tiny_mla();
    j["mla"].erase(key);
    const std::string e = error_of(j);
    BOOST_TEST(e.find(std::string("field 'mla.") + key + "': missing") != std::string::npos, e);
  }
  nlohmann::json odd = tiny_mla();
  odd["mla"]["qk_rope_head_dim"] = 3;
  BOOST_TEST(error_of(odd).find("field 'mla.qk_rope_head_dim'") != std::string::npos);
  nlohmann::json no_section = tiny_mla();
  no_section.erase("mla");
  BOOST_TEST(error_of(no_section).find("field 'mla'") != std::string::npos);
  nlohmann::json stray = tiny_mla();
  stray.erase("attention");
  BOOST_TEST(error_of(stray).find("field 'mla': expected no section") != std::string::npos);
  nlohmann::json gqa = tiny_mla();
  gqa["kv_heads"] = 2;
  BOOST_TEST(error_of(gqa).find("field 'kv_heads': must equal heads under MLA") !=
             std::string::npos);
  nlohmann::json biased = tiny_mla();
  biased["bias"] = true;
  BOOST_TEST(error_of(biased).find("field 'bias'") != std::string::npos);
  nlohmann::json kind = tiny_mla();
  kind["attention"] = "linear";
  BOOST_TEST(error_of(kind).find("field 'attention'") != std::string::npos);
}
