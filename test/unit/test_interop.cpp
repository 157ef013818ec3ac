// Interop: Hugging Face configs against published parameter totals, Megatron-LM command lines
// into plans and back, what each export target cannot express, and jobs on part of a node.
#define BOOST_TEST_MODULE interop
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/interop.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/search.hpp"
#include "test/support/input_error.hpp"
#include "test/support/run.hpp"

using namespace stratagem;
using namespace stratagem::interop;

namespace {

std::string hf(const std::string& name) {
  return test::source_dir() + "/test/data/hf/" + name + ".json";
}

ModelSpec import(const std::string& name, std::optional<int> seq_len = std::nullopt) {
  return model_from_hf_config(io::read_json_file(hf(name)), hf(name), seq_len);
}

using stratagem::test::input_error;

Plan megatron_round_trip(const Plan& p, const ModelSpec& m, ClusterSpec c) {
  const auto tokens = split_command_line(export_megatron(p, m, c), "exported");
  return megatron_job_from_args(tokens, c, "exported").plan;
}

}  // namespace

BOOST_AUTO_TEST_CASE(hf_imports_match_published_parameter_counts) {
  const std::pair<const char*, double> published[] = {
      {"llama3-8b", 8.03e9}, {"qwen2-7b", 7.62e9}, {"gpt2", 124e6}, {"gpt-neox-20b", 20.6e9}};
  for (const auto& [name, total] : published) {
    // Qwen2's 131072 positions are its served context: the import asks for a sequence (D12).
    const ModelSpec m =
        import(name, std::string(name) == "qwen2-7b" ? std::optional<int>(4096) : std::nullopt);
    const double rel = std::abs(double(m.parameters()) - total) / total;
    BOOST_TEST(rel < 0.005, name << ": " << m.parameters() << " vs " << total);
  }
  // Mistral-7B-v0.1 (7,241,732,096) with a sequence its sliding window covers.
  BOOST_TEST(import("mistral-7b", 4096).parameters() == 7241732096LL);
}

// D13: a Hub id in _name_or_path names the model; a local folder does not (the file does).
BOOST_AUTO_TEST_CASE(hf_name_or_path_names_the_model_only_as_a_hub_id) {
  nlohmann::json j = io::read_json_file(hf("llama3.1-8b"));
  auto name = [&](const std::string& v) {
    j["_name_or_path"] = v;
    return model_from_hf_config(j, "dir/llama3.1-8b.json", std::nullopt).name;
  };
  BOOST_TEST(name("meta-llama/Llama-3.1-8B").find("Llama-3.1-8B") != std::string::npos);
  BOOST_TEST(name("gpt2") == "gpt2");
  for (const char* path : {"/scratch/ckpt/step-1000", "./llama", "../llama/8b", "~/llama",
                           "models/llama/8b", "C:\\models\\llama"})
    BOOST_TEST(name(path) == "llama3.1-8b", path);
}

BOOST_AUTO_TEST_CASE(hf_llama3_import_is_the_builtin_model) {
  ModelSpec imported = import("llama3-8b");
  const ModelSpec builtin = load_model("llama3-8b");
  imported.name = builtin.name;
  BOOST_TEST(to_json(imported) == to_json(builtin));
}

BOOST_AUTO_TEST_CASE(hf_fields_are_read_per_architecture) {
  const ModelSpec gpt2 = import("gpt2");
  BOOST_TEST(gpt2.tied_embeddings);  // GPT2Config's default, not written in the file
  BOOST_TEST((gpt2.position == Position::learned && gpt2.activation == Activation::gelu));
  BOOST_TEST(gpt2.ffn_hidden == 4 * 768);  // n_inner null: 4 x n_embd
  const ModelSpec qwen = import("qwen2-7b", 4096);
  BOOST_TEST(qwen.kv_heads == 4);
  BOOST_TEST(!qwen.tied_embeddings);
  BOOST_TEST((qwen.norm == Norm::rmsnorm && qwen.activation == Activation::swiglu));
  const ModelSpec neox = import("gpt-neox-20b");
  BOOST_TEST((neox.position == Position::rope && neox.norm == Norm::layernorm));
  BOOST_TEST(neox.vocab == 50432);
  BOOST_TEST(import("qwen2-7b", 4096).seq_len == 4096);
}

// Issue 38, D12: max_position_embeddings is the longest context a model serves, not the sequence
// it trains at. Without --seq-len: rope_scaling's original context, else the positions up to
// 8192, else refused naming the field and --seq-len.
BOOST_AUTO_TEST_CASE(hf_training_sequence_is_the_pretraining_context) {
  BOOST_TEST(import("llama3.1-8b").seq_len == 8192);  // 131072 served, 8192 pretrained
  BOOST_TEST(import("llama3-8b").seq_len == 8192);
  BOOST_TEST(import("deepseek-v3").seq_len == 4096);  // 163840 served (YaRN), 4096 pretrained
  BOOST_TEST(import("gpt2").seq_len == 1024);
  BOOST_TEST(import("llama3.1-8b", 2048).seq_len == 2048);
  const std::string e = input_error([&] { import("qwen2-7b"); });
  BOOST_TEST(e.find("field 'max_position_embeddings': 131072") != std::string::npos, e);
  BOOST_TEST(e.find("give --seq-len") != std::string::npos, e);
  nlohmann::json j = io::read_json_file(hf("llama3.1-8b"));
  j["rope_scaling"]["original_max_position_embeddings"] = "8k";
  BOOST_TEST(input_error([&] {
               model_from_hf_config(j, "c.json");
             }).find("rope_scaling.original_max_position_embeddings") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(hf_moe_imports_match_published_totals) {
  // Mixtral: 46.7B total, 12.9B active; DeepSeek-V3: 671B and 37B without its MTP module.
  const ModelSpec mixtral = import("mixtral-8x7b", 4096);
  BOOST_TEST(mixtral.moe.experts == 8);
  BOOST_TEST(mixtral.moe.top_k == 2);
  BOOST_TEST(mixtral.moe.expert_ffn_hidden == 14336);
  BOOST_TEST(std::abs(double(mixtral.parameters()) - 46.7e9) / 46.7e9 < 0.01);
  BOOST_TEST(std::abs(double(mixtral.active_parameters()) - 12.9e9) / 12.9e9 < 0.01);
  const ModelSpec v3 = import("deepseek-v3", 4096);
  BOOST_TEST((v3.attention == AttentionKind::mla));
  BOOST_TEST(v3.mla.q_lora_rank == 1536);
  BOOST_TEST(v3.mla.kv_lora_rank == 512);
  BOOST_TEST(v3.mla.qk_rope_head_dim == 64);
  BOOST_TEST(v3.moe.experts == 256);
  BOOST_TEST(v3.moe.shared_experts == 1);
  BOOST_TEST(v3.moe.dense_layers == 3);
  BOOST_TEST(v3.moe.expert_groups == 8);
  BOOST_TEST(v3.moe.group_top_k == 4);
  BOOST_TEST((v3.moe.router_score == RouterScore::sigmoid));
  BOOST_TEST(v3.mtp_modules == 1);
  BOOST_TEST(std::abs(double(v3.parameters()) - 671e9) / 671e9 < 0.02);
  BOOST_TEST(std::abs(double(v3.active_parameters()) - 37e9) / 37e9 < 0.02);
  // The built-in and the import describe the same model.
  const ModelSpec builtin = load_model("deepseek-v3");
  BOOST_TEST(v3.parameters() == builtin.parameters());
  BOOST_TEST(v3.flops_per_token() == builtin.flops_per_token());
  // q_lora_rank null is DeepSeek-V2-Lite's uncompressed query, not the class default.
  nlohmann::json j = io::read_json_file(hf("deepseek-v3"));
  j["q_lora_rank"] = nullptr;
  BOOST_TEST(model_from_hf_config(j, "c.json", 4096).mla.q_lora_rank == 0);
  const auto notes = hf_import_notes(io::read_json_file(hf("deepseek-v3")));
  BOOST_TEST(!notes.empty());
  BOOST_TEST(notes[0].find("multi-token-prediction") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(hf_bad_configs_name_the_field) {
  nlohmann::json j = io::read_json_file(hf("llama3-8b"));
  j["architectures"] = {"FalconForCausalLM"};
  BOOST_TEST(input_error([&] { model_from_hf_config(j, "c.json"); }).find("FalconForCausalLM") !=
             std::string::npos);
  j = io::read_json_file(hf("llama3-8b"));
  j.erase("num_hidden_layers");
  BOOST_TEST(input_error([&] { model_from_hf_config(j, "c.json"); }).find("num_hidden_layers") !=
             std::string::npos);
  j = io::read_json_file(hf("mixtral-8x7b"));
  j["architectures"] = {"Qwen2MoeForCausalLM"};
  BOOST_TEST(input_error([&] {
               model_from_hf_config(j, "c.json");
             }).find("Mixture-of-Experts is not supported yet (issue #26)") != std::string::npos);
  j = io::read_json_file(hf("deepseek-v3"));
  j["moe_layer_freq"] = 2;
  BOOST_TEST(input_error([&] { model_from_hf_config(j, "c.json"); }).find("moe_layer_freq") !=
             std::string::npos);
  j = io::read_json_file(hf("deepseek-v3"));
  j.erase("kv_lora_rank");
  BOOST_TEST(input_error([&] {
               model_from_hf_config(j, "c.json");
             }).find("field 'kv_lora_rank': missing") != std::string::npos);
  j = io::read_json_file(hf("deepseek-v3"));
  j["num_experts_per_tok"] = 300;
  BOOST_TEST(input_error([&] { model_from_hf_config(j, "c.json"); }).find("moe.top_k") !=
             std::string::npos);
  // Mistral's 4096-token window does not cover its 32768 positions.
  BOOST_TEST(input_error([&] { import("mistral-7b"); }).find("sliding_window") !=
             std::string::npos);
}

// Every JSON input is parsed by io::parse_json: nesting is refused at kMaxJsonDepth + 1
// levels, arrays and objects alike, before it is built; a NUL byte (where nlohmann stops
// reading, accepting whatever follows) is refused with its offset.
BOOST_AUTO_TEST_CASE(json_inputs_refuse_deep_nesting_and_nul_bytes) {
  const int limit = io::kMaxJsonDepth;
  auto arrays = [](int levels) { return std::string(levels, '[') + std::string(levels, ']'); };
  auto objects = [](int levels) {
    std::string s;
    for (int i = 0; i < levels - 1; ++i) s += "{\"a\":";
    return s + "{}" + std::string(levels - 1, '}');
  };
  BOOST_TEST(io::parse_json(arrays(limit), "t").is_array());
  BOOST_TEST(io::parse_json(objects(limit), "t").is_object());
  const std::string deep = "t: nested deeper than " + std::to_string(limit) + " levels";
  BOOST_TEST(input_error([&] { io::parse_json(arrays(limit + 1), "t"); }).find(deep) == 0);
  BOOST_TEST(input_error([&] { io::parse_json(objects(limit + 1), "t"); }).find(deep) == 0);
  BOOST_TEST(input_error([&] { io::parse_json(arrays(140000), "t"); }).find(deep) == 0);
  BOOST_TEST(input_error([&] { io::parse_json(std::string("{}\0{", 4), "t"); }) ==
             "t: holds a NUL byte at offset 2, not JSON text");
}

BOOST_AUTO_TEST_CASE(command_lines_split_as_a_shell_would) {
  const auto t = split_command_line(
      "# comment\ntorchrun --nnodes 2 pretrain_gpt.py \\\n  --num-layers 4 --data-path 'a b' "
      "\"c\\\"d\"  # tail\n",
      "f");
  const std::vector<std::string> expected = {"torchrun",        "--nnodes",     "2",
                                             "pretrain_gpt.py", "--num-layers", "4",
                                             "--data-path",     "a b",          "c\"d"};
  BOOST_TEST(t == expected, boost::test_tools::per_element());
  BOOST_TEST(input_error([] { split_command_line("--x 'open", "f"); }).find("quote") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(megatron_command_line_reads_model_and_plan) {
  ClusterSpec c = load_cluster("dgx-a100-80g");
  const auto tokens = split_command_line(
      "torchrun --nnodes 4 --nproc-per-node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
      "--num-attention-heads 32 --group-query-attention --num-query-groups 8 --ffn-hidden-size "
      "14336 --swiglu --normalization RMSNorm --position-embedding-type rope --rotary-base 500000 "
      "--untie-embeddings-and-output-weights --disable-bias-linear --attention-dropout 0.0 "
      "--hidden-dropout 0.0 --seq-length 8192 --max-position-embeddings 8192 --vocab-size 128256 "
      "--tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --sequence-parallel "
      "--recompute-granularity full --recompute-method block --recompute-num-layers 2 "
      "--use-distributed-optimizer --micro-batch-size 1 --global-batch-size 64 --bf16 "
      "--decoder-first-pipeline-num-layers 6 --decoder-last-pipeline-num-layers 6 --lr 3e-4 "
      "--data-path 1.0 /data/a 2.0 /data/b",
      "job.sh");
  const MegatronJob job = megatron_job_from_args(tokens, c, "job.sh");
  ModelSpec builtin = load_model("llama3-8b");
  builtin.name = job.model.name;
  BOOST_TEST(to_json(job.model) == to_json(builtin));
  BOOST_TEST(c.world_size() == 32);
  const Plan& p = job.plan;
  BOOST_TEST((p.pp == 4 && p.layers[0].tp == 4 && p.layers[0].dp == 2));
  BOOST_TEST((p.layers[0].sequence_parallel && p.layers[0].zero == 1));
  BOOST_TEST((p.chunks[0].size() == 6 && p.chunks[1].size() == 10 && p.chunks[3].size() == 6));
  // The block method: the first two layers of every stage.
  BOOST_TEST(
      (p.layers[0].recompute == Recompute::full && p.layers[2].recompute == Recompute::none));
  BOOST_TEST(
      (p.layers[6].recompute == Recompute::full && p.layers[8].recompute == Recompute::none));
  BOOST_TEST(p.num_microbatches() == 32);
  const std::vector<std::string> ignored = {"--lr", "--data-path"};
  BOOST_TEST(job.ignored_flags == ignored, boost::test_tools::per_element());
  // And back: the export reads in as the same plan.
  BOOST_TEST(to_json(megatron_round_trip(p, job.model, c)) == to_json(p));
}

BOOST_AUTO_TEST_CASE(megatron_bad_flags_name_the_flag) {
  ClusterSpec c = load_cluster("dgx-a100-80g");
  const std::string base =
      "--num-layers 4 --hidden-size 256 --num-attention-heads 4 "
      "--seq-length 128 --vocab-size 1000 --micro-batch-size 1 ";
  auto err = [&](const std::string& extra) {
    return input_error([&] {
      ClusterSpec cc = c;
      megatron_job_from_args(split_command_line(base + extra, "f"), cc, "f");
    });
  };
  BOOST_TEST(
      err("--tensor-model-parallel-size").find("--tensor-model-parallel-size: needs a value") !=
      std::string::npos);
  BOOST_TEST(err("--tensor-model-parallel-size --bf16").find("needs a value") != std::string::npos);
  BOOST_TEST(err("--tensor-model-parallel-size x").find("expected an integer") !=
             std::string::npos);
  BOOST_TEST(err("--num-experts 8").find("Mixture-of-Experts is not supported yet (issue #26)") !=
             std::string::npos);
  // Context parallelism imports as cp with Megatron-Core's kind (p2p: the ring); its
  // hierarchical a2a+p2p is refused.
  BOOST_TEST(err("--context-parallel-size 2").empty());
  BOOST_TEST(err("--context-parallel-size 2 --cp-comm-type a2a+p2p")
                 .find("--cp-comm-type: a2a+p2p (hierarchical context parallelism) is not "
                       "modelled") != std::string::npos);
  {
    ClusterSpec cc = c;
    const MegatronJob job = megatron_job_from_args(
        split_command_line(base + "--context-parallel-size 2 --cp-comm-type all_gather", "f"), cc,
        "f");
    BOOST_TEST(job.plan.layers.front().cp == 2);
    BOOST_TEST((job.plan.layers.front().cp_kind == CpKind::allgather));
    BOOST_TEST(job.plan.devices_per_stage() == cc.world_size());
  }
  BOOST_TEST(err("--recompute-granularity full").find("--recompute-method") != std::string::npos);
  BOOST_TEST(err("").empty());
  // Dropouts are probabilities, and Megatron-LM refuses --bf16 with --fp16.
  BOOST_TEST(err("--attention-dropout 0 --hidden-dropout 1").empty());
  for (const char* v : {"nan", "-1", "inf", "1.5"})
    BOOST_TEST(err(std::string("--attention-dropout ") + v) ==
               std::string("f: flag --attention-dropout: expected a probability in [0, 1], got '") +
                   v + "'");
  BOOST_TEST(err("--attention-dropout 0.1 --hidden-dropout 7").find("--hidden-dropout") !=
             std::string::npos);
  BOOST_TEST(err("--bf16 --fp16") == "f: flag --fp16: given with --bf16; give one of them");
}

// D3: flags that shape the plan are read (the stage layout, the pre-v3.0 recompute names) or
// refused naming them (FP8), never skipped.
BOOST_AUTO_TEST_CASE(megatron_plan_shaping_flags_are_read_or_refused) {
  const ClusterSpec c = load_cluster("dgx-a100-80g");
  const std::string base =
      "--num-layers 32 --hidden-size 512 --num-attention-heads 8 --seq-length 128 "
      "--vocab-size 1000 --micro-batch-size 1 --global-batch-size 8 "
      "--pipeline-model-parallel-size 4 ";
  auto job = [&](const std::string& extra) {
    ClusterSpec cc = c;
    return megatron_job_from_args(split_command_line(base + extra, "f"), cc, "f");
  };
  auto err = [&](const std::string& extra) { return input_error([&] { job(extra); }); };
  // Megatron-Core's layout: 7/8/8/9 over the four stages; with 8 stages, two virtual per rank.
  const Plan split = job("--pipeline-model-parallel-layout 'Et*7|t*8|t*8|t*9L'").plan;
  const std::vector<LayerRange> want{{0, 7}, {7, 15}, {15, 23}, {23, 32}};
  BOOST_TEST((split.chunks == want));
  const Plan vpp = job("--pipeline-model-parallel-layout E(t*4|)*7,t*4L").plan;
  BOOST_TEST((vpp.vpp == 2 && vpp.schedule == Schedule::interleaved && vpp.chunks.size() == 8));
  BOOST_TEST(err("--pipeline-model-parallel-layout Et*8|t*8|t*8|t*9L")
                 .find("--pipeline-model-parallel-layout: holds 33 decoder layers") !=
             std::string::npos);
  BOOST_TEST(err("--pipeline-model-parallel-layout Et*8|t*8|t*8|t*7m,L").find("'m'") !=
             std::string::npos);
  BOOST_TEST(err("--pipeline-model-parallel-layout Et*16|t*16L").find("not a multiple of pp 4") !=
             std::string::npos);
  // The pre-v3.0 names are the current recompute flags: same plan.
  const Plan old =
      job("--activations-checkpoint-method block --activations-checkpoint-num-layers 2").plan;
  const Plan now =
      job("--recompute-granularity full --recompute-method block --recompute-num-layers 2").plan;
  BOOST_TEST(to_json(old) == to_json(now));
  BOOST_TEST(
      (old.layers[1].recompute == Recompute::full && old.layers[2].recompute == Recompute::none));
  BOOST_TEST(to_json(job("--checkpoint-activations").plan) ==
             to_json(job("--recompute-granularity full --recompute-method uniform").plan));
  BOOST_TEST(err("--activations-checkpoint-method uniform --recompute-method block")
                 .find("--activations-checkpoint-method: given with --recompute-method") !=
             std::string::npos);
  BOOST_TEST(err("--fp8-format hybrid").find("flag --fp8-format: FP8 training is not modelled") !=
             std::string::npos);
}

BOOST_AUTO_TEST_CASE(heterogeneous_plans_name_layers_and_nearest_exports) {
  const ModelSpec m = load_model("gpt3-1.3b");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  PlanShorthand s;
  s.tp = 2, s.pp = 2, s.global_batch = 64;
  Plan p = expand_shorthand(s, m, c);
  for (int k = 12; k < 24; ++k) p.layers[k].tp = 4, p.layers[k].dp = 1;
  validate(p, m, c, "test");
  for (Target t : {Target::megatron, Target::torchtitan, Target::deepspeed}) {
    const std::string e = input_error([&] { export_plan(p, m, c, t); });
    BOOST_TEST(e.find("per-layer tensor/data-parallel degrees") != std::string::npos, e);
    BOOST_TEST(e.find("layers 12-23 tp4 dp1") != std::string::npos, e);
    const Plan q = nearest_expressible(p, m, c, t);
    BOOST_TEST(unexpressible(q, m, t).empty());
    BOOST_TEST(!export_plan(q, m, c, t).empty());
  }
  // ZeRO-3 is not Megatron's; the nearest is its distributed optimizer.
  s.zero = 3;
  const Plan z3 = expand_shorthand(s, m, c);
  BOOST_TEST(!unexpressible(z3, m, Target::megatron).empty());
  BOOST_TEST(nearest_expressible(z3, m, c, Target::megatron).layers[0].zero == 1);
  BOOST_TEST(unexpressible(z3, m, Target::deepspeed).size() == 1);  // ZeRO-3 with pp 2
  s.pp = 1;
  BOOST_TEST(unexpressible(expand_shorthand(s, m, c), m, Target::deepspeed).empty());
}

// D11: --nearest gives memory back for time until the plan fits, keeping its layout, or says none.
BOOST_AUTO_TEST_CASE(nearest_fitting_keeps_the_layout_and_fits_or_is_none) {
  const ModelSpec m = load_model("llama2-13b");
  const ClusterSpec c = load_cluster("dgx-a100-80g");
  const FrameworkSpec fw;
  PlanShorthand s;
  s.tp = 2, s.zero = 3, s.micro_batch = 4, s.global_batch = 64;
  const Plan p = expand_shorthand(s, m, c);
  for (Target t : {Target::megatron, Target::torchtitan, Target::deepspeed}) {
    const Plan q = unexpressible(p, m, t).empty() ? p : nearest_expressible(p, m, c, t);
    BOOST_TEST(!fits_gpu_memory(estimate(CostModel(m, c, q.dtype, fw), q), c));  // 200 GiB as asked
    const auto f = nearest_fitting(q, m, c, fw, t);
    BOOST_REQUIRE(f.has_value());
    BOOST_TEST(fits_gpu_memory(estimate(CostModel(m, c, f->dtype, fw), *f), c));
    BOOST_TEST(unexpressible(*f, m, t).empty());
    BOOST_TEST((f->pp == q.pp && f->chunks == q.chunks && f->global_batch == q.global_batch));
    BOOST_TEST((f->layers[0].tp == q.layers[0].tp && f->layers[0].dp == q.layers[0].dp));
    BOOST_TEST(f->micro_batch <= q.micro_batch);
  }
  // A plan that fits is its own nearest.
  s.micro_batch = 1;
  const Plan fits = expand_shorthand(s, m, c);
  BOOST_TEST(to_json(*nearest_fitting(fits, m, c, fw, Target::deepspeed)) == to_json(fits));
  // GPT-3 175B on one node: even the distributed optimizer with full recompute needs more.
  const ModelSpec big = load_model("gpt3-175b");
  PlanShorthand b;
  b.tp = 8, b.global_batch = 64;
  BOOST_TEST(!nearest_fitting(expand_shorthand(b, big, c), big, c, fw, Target::megatron));
}

BOOST_AUTO_TEST_CASE(megatron_round_trips_interleaved_and_uneven_plans) {
  const ModelSpec m = load_model("gpt3-1.3b");  // 24 layers
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 2;
  PlanShorthand s;
  s.tp = 2, s.pp = 4, s.vpp = 3, s.global_batch = 64, s.micro_batch = 2;
  s.recompute = "selective", s.sequence_parallel = true, s.zero = 1;
  const Plan interleaved = expand_shorthand(s, m, c);
  BOOST_TEST(to_json(megatron_round_trip(interleaved, m, c)) == to_json(interleaved));
  // 5 micro-batches on pp 4: Megatron-Core's group of micro-batches per virtual stage carries
  // the schedule (one group of 5 here), chosen or given.
  for (int group : {0, 5}) {
    PlanShorthand odd = s;
    odd.global_batch = 20;
    if (group) odd.microbatch_group = group;
    const Plan p = expand_shorthand(odd, m, c);
    validate(p, m, c, "test");
    BOOST_TEST(export_megatron(p, m, c).find(
                   "--microbatch-group-size-per-virtual-pipeline-stage 5") != std::string::npos);
    const Plan back = megatron_round_trip(p, m, c);
    BOOST_TEST(back.microbatch_group_size(5) == 5);
    if (!group) BOOST_TEST(to_json(back) == to_json(p));
  }
  s.vpp.reset(), s.recompute = "full";
  Plan uneven = expand_shorthand(s, m, c);
  uneven.chunks = {{0, 3}, {3, 10}, {10, 17}, {17, 24}};
  BOOST_TEST(unexpressible(uneven, m, Target::megatron).empty());
  BOOST_TEST(to_json(megatron_round_trip(uneven, m, c)) == to_json(uneven));
  uneven.chunks = {{0, 3}, {3, 12}, {12, 17}, {17, 24}};
  BOOST_TEST(unexpressible(uneven, m, Target::megatron).size() == 1);
}

BOOST_AUTO_TEST_CASE(partial_node_divides_shared_links_and_host) {
  ClusterSpec c = load_cluster("dgx-a100-80g");
  const double gpu_share = c.internode_gbps_per_gpu();
  restrict_to_gpus(c, 2, "--gpus-per-node");
  BOOST_TEST(c.node.gpus_per_node == 2);
  BOOST_TEST(c.node.nic_count == 2);
  BOOST_TEST(c.internode_gbps_per_gpu() == gpu_share);
  BOOST_TEST(c.node.gpus_per_pcie_switch == 2);  // GPUs 0 and 1 share DGX A100's first switch
  BOOST_TEST(c.node.host_memory_bytes == 2199023255552LL / 4);
  ClusterSpec one = load_cluster("dgx-a100-80g");
  restrict_to_gpus(one, 1, "--gpus-per-node");
  BOOST_TEST(one.node.gpus_per_pcie_switch == 1);
  BOOST_TEST(input_error([&] {
               restrict_to_gpus(one, 9, "--gpus-per-node");
             }).find("--gpus-per-node: expected 1 to 1") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(cross_node_tp_is_priced_by_the_cost_model) {
  ModelSpec m = load_model("gpt3-175b");
  m.layers = 8;  // 96 heads: tp 16 divides them
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 4;
  auto iteration_s = [&](const ClusterSpec& on, int tp) {
    PlanShorthand s;
    s.tp = tp, s.pp = 1, s.global_batch = 64, s.micro_batch = 1, s.sequence_parallel = true;
    const Plan p = expand_shorthand(s, m, on);
    validate(p, m, on, "test");
    const CostModel cost(m, on, p.dtype);
    return estimate(cost, p).iteration_time_s;
  };
  // tp 16 spans two nodes: its collectives cross the NICs and cost more than tp 8's NVSwitch.
  BOOST_TEST(iteration_s(c, 16) > iteration_s(c, 8));
  // The same 32 GPUs as two nodes of 16 keep tp 16 on NVSwitch: the gap is the link, priced by
  // the cost model's cross-node collectives.
  ClusterSpec wide = c;
  wide.node.gpus_per_node = 16, wide.node.nic_count = 16, wide.nodes = 2;
  BOOST_TEST(iteration_s(wide, 16) < iteration_s(c, 16));
}

BOOST_AUTO_TEST_CASE(search_considers_cross_node_tp_only_when_asked) {
  ModelSpec m;
  m.name = "tiny", m.layers = 2, m.hidden = 256, m.heads = 16, m.kv_heads = 16;
  m.ffn_hidden = 1024, m.vocab = 512, m.seq_len = 64;
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 2;
  SearchOptions o;
  o.global_batch = 16;
  o.pp_degrees = {1};
  o.zero_stages = {0};
  o.recompute = {Recompute::none};
  o.offload = false;
  o.sequence_parallel_on = false;
  o.schedules = {Schedule::one_f_one_b};
  auto widest_tp = [&] {
    int widest = 0;
    for_each_plan(m, c, o, [&](const Plan& p) {
      for (const auto& l : p.layers) widest = std::max(widest, l.tp);
    });
    return widest;
  };
  BOOST_TEST(widest_tp() == 8);  // the GPUs of a node
  o.allow_cross_node_tp = true;
  BOOST_TEST(widest_tp() == 16);  // both nodes
}

// Issue 41: a name from an input file reached the exported jobs raw. Imports refuse an unsafe
// name naming the field; the exporters escape whatever they are given, so a name built another
// way cannot inject a line either.
BOOST_AUTO_TEST_CASE(names_cannot_inject_lines_into_exports) {
  const std::string evil = "evil\n--save /some/dir\n[job]\x1b[31m";
  nlohmann::json j = io::read_json_file(hf("gpt2"));
  j["_name_or_path"] = evil;
  BOOST_TEST(input_error([&] {
               model_from_hf_config(j, "c.json");
             }).find("c.json: field '_name_or_path': expected a name") != std::string::npos);
  j["_name_or_path"] = "openai-community/gpt2";
  BOOST_TEST(model_from_hf_config(j, "c.json").name == "openai-community/gpt2");
  // A file's name is the fallback, made safe rather than refused.
  j.erase("_name_or_path");
  BOOST_TEST(model_from_hf_config(j, "/x/my\nmodel/config.json").name == "my_model");

  ModelSpec m = load_model("gpt2-124m");
  m.name = evil;
  ClusterSpec one_node = load_cluster("dgx-a100-80g");
  one_node.nodes = 1;
  PlanShorthand s;
  s.tp = 1, s.pp = 1, s.dp = 8, s.micro_batch = 1, s.global_batch = 8;
  const Plan p = expand_shorthand(s, m, one_node);
  auto lines_starting = [](const std::string& text, const std::string& prefix) {
    int n = 0;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) n += line.rfind(prefix, 0) == 0;
    return n;
  };
  const std::string megatron = export_megatron(p, m, one_node);
  BOOST_TEST(lines_starting(megatron, "--save") == 0, megatron);
  BOOST_TEST(megatron.find('\x1b') == std::string::npos);
  const std::string toml = export_torchtitan(p, m, one_node);
  BOOST_TEST(lines_starting(toml, "[job]") == 1, toml);
  BOOST_TEST(lines_starting(toml, "--save") == 0, toml);
  BOOST_TEST(toml.find("flavor = \"evil\\u000A--save /some/dir\\u000A[job]\\u001B[31m\"") !=
                 std::string::npos,
             toml);
}
