// Spec loading: built-in models and clusters, parameter counts, and every bad-input case.
#define BOOST_TEST_MODULE specs
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "stratagem/error.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/spec_json.hpp"
#include "test/support/run.hpp"

using namespace stratagem;

namespace {
std::string write_temp(const std::string& name, const std::string& text) {
  auto dir = std::filesystem::temp_directory_path() / "stratagem_test_specs";
  std::filesystem::create_directories(dir);
  auto p = dir / name;
  std::ofstream(p) << text;
  return p.string();
}
bool one_line(const std::string& s) {
  std::string t = s;
  while (!t.empty() && t.back() == '\n') t.pop_back();
  return !t.empty() && t.find('\n') == std::string::npos;
}
}  // namespace

BOOST_AUTO_TEST_CASE(parameter_counts_match_published_totals) {
  // Exact published totals (HF model cards, papers) to 1%; GPT-3's sizes are rounded to the
  // digits printed in Brown et al., so those get the rounding as tolerance.
  struct Row {
    const char* name;
    double published;
    double tolerance;
  };
  const Row rows[] = {{"gpt2-124m", 124.44e6, 0.01},
                      {"gpt2-350m", 354.8e6, 0.01},
                      {"gpt2-774m", 774.0e6, 0.01},
                      {"gpt2-1.5b", 1557.6e6, 0.01},
                      {"gpt3-175b", 174.6e9, 0.01},
                      {"llama2-7b", 6.74e9, 0.01},
                      {"llama2-13b", 13.016e9, 0.01},
                      {"llama2-70b", 68.98e9, 0.01},
                      {"llama3-8b", 8.03e9, 0.01},
                      {"llama3-70b", 70.55e9, 0.01},
                      {"bert-large", 336.2e6, 0.01},
                      {"bert-huge-32", 672e6, 0.01},
                      {"gpt3-1.3b", 1.3e9, 0.05 / 1.3},
                      {"gpt3-6.7b", 6.7e9, 0.05 / 6.7},
                      {"gpt3-13b", 13.0e9, 0.05 / 13.0 + 0.01}};
  for (const auto& r : rows) {
    ModelSpec m = load_model(r.name);
    double rel = std::abs(double(m.parameters()) - r.published) / r.published;
    BOOST_TEST_INFO(r.name << ": computed " << m.parameters() << " published " << r.published);
    BOOST_TEST(rel <= r.tolerance);
  }
  BOOST_TEST(load_model("gpt2-124m").parameters() == 124439808);  // HF gpt2, exactly
}

BOOST_AUTO_TEST_CASE(flops_per_token_is_megatron_formula_for_gpt) {
  ModelSpec m = load_model("gpt3-175b");
  const double l = m.layers, h = m.hidden, s = m.seq_len, V = m.vocab;
  const double megatron = 72.0 * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h)) / s;
  BOOST_TEST(std::abs(m.flops_per_token() - megatron) / megatron < 1e-3);
}

BOOST_AUTO_TEST_CASE(all_builtin_clusters_load) {
  for (const char* n :
       {"dgx-a100-40g", "dgx-a100-80g", "dgx-h100", "hgx-h200", "hgx-h800", "cpu-local"}) {
    ClusterSpec c = load_cluster(n);
    BOOST_TEST(c.node.gpus_per_node >= 1);
    BOOST_TEST(c.gpu.peak_flops(Dtype::bf16) > 0);
    BOOST_TEST(c.gpu.hbm_bytes > 0);
  }
  // The H800 is the H100 SXM with NVLink cut to 400 GB/s bidirectional (DeepSeek-V3's cluster).
  const ClusterSpec h800 = load_cluster("hgx-h800"), h100 = load_cluster("dgx-h100");
  BOOST_TEST(h800.gpu.peak_flops(Dtype::bf16) == h100.gpu.peak_flops(Dtype::bf16));
  BOOST_TEST(h800.node.intra.bandwidth_gbps == 200);
  BOOST_TEST(h800.node.nic_count == 8);
  BOOST_TEST(h800.node.nic.bandwidth_gbps == 50);
  ClusterSpec a = load_cluster("dgx-a100-80g");
  BOOST_TEST(a.node.gpus_per_node == 8);
  BOOST_TEST(a.gpu.peak_flops(Dtype::bf16) == 312e12);
}

BOOST_AUTO_TEST_CASE(model_bad_inputs_name_the_file_and_field) {
  auto expect = [](const std::string& text, const std::string& field) {
    std::string path = write_temp("bad_model.json", text);
    try {
      load_model(path);
      BOOST_FAIL("no error for " << text);
    } catch (const InputError& e) {
      std::string msg = e.what();
      BOOST_TEST_INFO(msg);
      BOOST_TEST(msg.find(path) != std::string::npos);
      BOOST_TEST(msg.find(field) != std::string::npos);
    }
  };
  expect("{\"name\": \"x\", \"layers\": 2", "malformed");
  expect(R"({"name":"x","layers":2,"hidden":64,"heads":4,"vocab":10,"seq_len":8,"colour":1})",
         "colour");
  expect(R"({"name":"x","layers":2,"hidden":64,"heads":5,"vocab":10,"seq_len":8})", "heads");
  expect(R"({"name":"x","layers":2,"hidden":64,"heads":4,"kv_heads":3,"vocab":10,"seq_len":8})",
         "kv_heads");
  expect(R"({"name":"x","hidden":64,"heads":4,"vocab":10,"seq_len":8})", "layers");
  expect(R"({"name":"x","layers":"two","hidden":64,"heads":4,"vocab":10,"seq_len":8})", "layers");
  BOOST_CHECK_THROW(load_model("no-such-model"), InputError);
  BOOST_CHECK_THROW(load_model("/nonexistent/model.json"), InputError);
}

BOOST_AUTO_TEST_CASE(cluster_bad_inputs) {
  auto good = nlohmann::json::parse(R"({
    "name": "t", "nodes": 1,
    "gpu": {"name": "g", "peak_flops": {"fp32": 1e12}, "hbm_bytes": 1073741824, "hbm_bandwidth_gbps": 100},
    "node": {"gpus_per_node": 2, "intra": {"kind": "nvlink", "bandwidth_gbps": 50, "latency_s": 1e-6},
             "pcie": {"bandwidth_gbps": 10, "latency_s": 1e-6}, "host_memory_bytes": 1073741824,
             "host_flops": 1e11, "host_memory_bandwidth_gbps": 10,
             "nics": {"count": 1, "bandwidth_gbps": 10, "latency_s": 1e-5}},
    "network": {"topology": "fat-tree", "oversubscription": 1.0}})");
  BOOST_CHECK_NO_THROW(cluster_from_json(good, "t.json"));
  auto bad = good;
  bad["gpu"]["hbm_bandwidth_gbps"] = -1;
  BOOST_CHECK_THROW(cluster_from_json(bad, "t.json"), InputError);
  bad = good;
  bad["node"]["nics"]["speed"] = 3;
  try {
    cluster_from_json(bad, "t.json");
    BOOST_FAIL("unknown field accepted");
  } catch (const InputError& e) {
    BOOST_TEST(std::string(e.what()).find("node.nics.speed") != std::string::npos);
  }
  bad = good;
  bad["network"]["topology"] = "torus";
  BOOST_CHECK_THROW(cluster_from_json(bad, "t.json"), InputError);
}

BOOST_AUTO_TEST_CASE(plan_validation_errors) {
  ModelSpec m = load_model("gpt3-175b");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 128;
  PlanShorthand s;
  s.tp = 8, s.pp = 16, s.dp = 8, s.micro_batch = 1, s.global_batch = 1536;
  Plan ok = expand_shorthand(s, m, c);
  BOOST_CHECK_NO_THROW(validate(ok, m, c, "flags"));
  BOOST_TEST(ok.num_microbatches() == 192);

  auto expect = [&](Plan p, const std::string& needle, ClusterSpec cc) {
    try {
      validate(p, m, cc, "flags");
      BOOST_FAIL("accepted: " << needle);
    } catch (const InputError& e) {
      BOOST_TEST_INFO(e.what());
      BOOST_TEST(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  ClusterSpec small = c;
  small.nodes = 64;
  expect(ok, "world size", small);
  Plan p = ok;
  for (auto& l : p.layers) l.tp = 5, l.dp = 64 * 8 / 5;
  expect(p, "heads", c);
  p = ok;
  p.chunks[3].end -= 1;
  expect(p, "chunks", c);
  p = ok;
  p.micro_batch = 5;
  expect(p, "global batch", c);
  p = ok;
  p.schedule = Schedule::interleaved;
  p.vpp = 2;
  p.chunks = even_chunks(96, 32);
  p.global_batch = 8 * 8;  // 8 micro-batches < pp 16
  expect(p, "at least pp (16) micro-batches", c);
  // Megatron-Core's groups of micro-batches per virtual stage: any number of micro-batches from
  // pp, in groups of pp to all of them whose last group is none or at least pp.
  p.global_batch = 8 * 120;
  validate(p, m, c, "test");  // groups of 20 (interleaved_group)
  BOOST_TEST(p.microbatch_group_size(120) == 20);
  p.microbatch_group = 16;  // leaves 8
  expect(p, "last group of 8, fewer than pp (16)", c);
  p.microbatch_group = 12;
  expect(p, "expected pp (16) to the number of micro-batches (120)", c);
  p.microbatch_group = 40;
  validate(p, m, c, "test");
  p.schedule = Schedule::one_f_one_b, p.vpp = 1, p.chunks = even_chunks(96, 16);
  expect(p, "needs schedule 'interleaved'", c);
}

BOOST_AUTO_TEST_CASE(plan_json_round_trip_with_heterogeneous_layers) {
  ModelSpec m = load_model("gpt2-124m");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  PlanShorthand s;
  s.tp = 2, s.pp = 2, s.micro_batch = 2, s.global_batch = 64;
  Plan p = expand_shorthand(s, m, c);
  p.layers[3].tp = 4, p.layers[3].dp = 1, p.layers[3].zero = 3;
  p.layers[7].recompute = Recompute::full;
  p.chunks = {{0, 5}, {5, 12}};
  validate(p, m, c, "test");
  Plan q = plan_from_json(to_json(p), m, "round-trip");
  BOOST_TEST((q.layers == p.layers));
  BOOST_TEST((q.chunks == p.chunks));
  BOOST_TEST(q.micro_batch == p.micro_batch);
  BOOST_TEST(q.global_batch == p.global_batch);
}

BOOST_AUTO_TEST_CASE(cli_bad_input_is_one_line_and_exit_2) {
  using stratagem::test::run;
  const std::string base = "plan check --model gpt3-175b --cluster dgx-a100-80g ";
  struct Case {
    std::string args;
    std::string needle;
  };
  const Case cases[] = {
      {base + "--nodes 64 --tp 8 --pp 16 --dp 8 --global-batch 1536", "world size"},
      {base + "--nodes 128 --tp 8 --pp 16 --dp 8 --micro-batch 5 --global-batch 1536",
       "global batch"},
      {"plan check --model gpt2-124m --cluster dgx-a100-80g --nodes 1 --tp 8 --pp 1", "heads"},
      {"plan check --model nope --nodes 1", "--model 'nope'"},
      {"plan check --model gpt2-124m --cluster nope", "--cluster 'nope'"},
      {base + "--nodes 128 --tp 8 --pp 16 --bogus 3", "--bogus"},
      {"plan check --model gpt2-124m --nodes 1 --plan /nonexistent/plan.json",
       "/nonexistent/plan.json"},
      {base + "--nodes 128 --tp 8 --pp 16 --vpp 2 --global-batch 512 --micro-batch 8",
       "at least pp"},
      {base + "--nodes 128 --tp 8 --pp 16 --vpp 2 --global-batch 960 --microbatch-group 16",
       "microbatch_group: 120 micro-batches in groups of 16 leave a last group of 8"},
  };
  for (const auto& k : cases) {
    auto r = run(k.args);
    BOOST_TEST_INFO(k.args << " -> " << r.output);
    BOOST_TEST(r.exit_code == 2);
    BOOST_TEST(one_line(r.output));
    BOOST_TEST(r.output.find(k.needle) != std::string::npos);
  }
}

BOOST_AUTO_TEST_CASE(cli_acceptance_plan_check_json) {
  auto r = stratagem::test::run(
      "plan check --model gpt3-175b --cluster dgx-a100-80g --nodes 128 --tp 8 --pp 16 --dp 8 "
      "--micro-batch 1 --global-batch 1536 --json");
  BOOST_TEST(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.output);
  BOOST_TEST(j["layout"]["world_size"] == 1024);
  BOOST_TEST(j["layout"]["tp_groups_within_node"] == true);
  BOOST_TEST(j["layout"]["num_microbatches"] == 192);
  auto m = stratagem::test::run("model show gpt2-124m --json");
  auto mj = nlohmann::json::parse(m.output);
  BOOST_TEST(mj["parameters"] == 124439808);
  BOOST_TEST(mj.contains("flops_per_token"));
}
