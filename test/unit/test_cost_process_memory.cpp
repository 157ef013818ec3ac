// The GPU process ledger (src/cost/process_memory.cpp): the CUDA context, NCCL's buffers per
// communicator the Layout gives a rank, the cuBLAS workspaces and the caching allocator's
// fragmentation, each a key of memory_breakdown_bytes; the reserved and allocated peaks of
// `estimate` and `simulate`, and their warning near the GPU's memory.
#define BOOST_TEST_MODULE cost_process_memory
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/loaders.hpp"
#include "test/support/run.hpp"

using namespace stratagem;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kMiB = 1 << 20;

int64_t nccl_bytes(const std::string& cluster, int nodes, PlanShorthand s,
                   const std::string& model = "gpt2-124m", int stage = 0) {
  const ModelSpec m = load_model(model);
  ClusterSpec c = load_cluster(cluster);
  c.nodes = nodes;
  if (!s.global_batch) s.global_batch = 64;
  const Plan p = expand_shorthand(s, m, c);
  validate(p, m, c, "test");
  return process_memory(m, c, p, stage).nccl_buffers_bytes;
}

PlanShorthand layout(int tp, int pp, int dp) {
  PlanShorthand s;
  s.tp = tp, s.pp = pp, s.dp = dp, s.micro_batch = 1;
  return s;
}

// Cluster files a test writes: dgx-a100-80g with one GPU figure changed, each removed when the
// set goes out of scope.
class EditedClusters {
 public:
  std::string write(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    std::ifstream in(test::source_dir() + "/data/clusters/dgx-a100-80g.json");
    nlohmann::json j = nlohmann::json::parse(in, nullptr, true, true);
    edit(j);
    paths_.push_back(
        (fs::temp_directory_path() /
         ("stratagem_process_memory_" + std::to_string(::getpid()) + "_" + name + ".json"))
            .string());
    std::ofstream(paths_.back()) << j.dump();
    return paths_.back();
  }
  ~EditedClusters() {
    for (const std::string& p : paths_) fs::remove(p);
  }

 private:
  std::vector<std::string> paths_;
};

nlohmann::json json_of(const test::RunResult& r) {
  return nlohmann::json::parse(r.output.substr(r.output.find('{')));
}

}  // namespace

BOOST_AUTO_TEST_CASE(nccl_counts_each_communicator_by_its_channels_and_peers) {
  // Per channel a communicator holds its ring's connection and, beyond two ranks, its tree's
  // second one: 12 MiB each (the cluster files' connection_bytes); NVLS adds 16 channels x 6 MiB
  // per rank of it on the node where there are more than two.
  const int64_t conn = 12 * kMiB, nvls = 16 * 6 * kMiB;
  // H100, dp 8 on one node: one communicator of 8 ranks, 32 channels.
  BOOST_TEST(nccl_bytes("dgx-h100", 1, layout(1, 1, 8)) == 32 * 2 * conn + 8 * nvls);
  // tp 2 x dp 4: a tp pair (one connection a channel, no NVLS for two GPUs) and the dp four.
  BOOST_TEST(nccl_bytes("dgx-h100", 1, layout(2, 1, 4)) == 32 * conn + (32 * 2 * conn + 4 * nvls));
  // A100 (24 channels, no NVLS), pp 2 x dp 4 of GPT-2 (tied embeddings): the dp four, the
  // pipeline pair with its sends to the other stage (32 p2p channels), and the tied-embedding
  // pair of the first and the last stage.
  BOOST_TEST(nccl_bytes("dgx-a100-80g", 1, layout(1, 2, 4)) ==
             24 * 2 * conn + (24 * conn + 32 * conn) + 24 * conn);
  // Two nodes, tp 8 x dp 2: the tp eight in the node; the dp pair across nodes has one rank a
  // node, one NIC: 2 channels.
  BOOST_TEST(nccl_bytes("dgx-a100-80g", 2, layout(8, 1, 2), "gpt2-350m") ==
             24 * 2 * conn + 2 * conn);
  // tp 8 alone: one communicator, dp 1 makes none.
  BOOST_TEST(nccl_bytes("dgx-a100-80g", 1, layout(8, 1, 1), "gpt2-350m") == 24 * 2 * conn);
}

BOOST_AUTO_TEST_CASE(a_reshard_is_counted_on_the_stage_of_the_layer_that_receives_it) {
  // tp 2 x pp 2 x dp 2, sequence parallel but for the last layer of stage 0: the stream is held
  // by tp 2 there and by every rank around it, so layers 10 -> 11 (stage 0) and 11 -> 12 (stage
  // 1, where the Program reshards) each meet in a reshard pair: one 2-rank communicator more on
  // each stage than the uniform plan.
  const ModelSpec m = load_model("gpt2-350m");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  PlanShorthand s = layout(2, 2, 2);
  s.global_batch = 64, s.sequence_parallel = true;
  Plan uniform = expand_shorthand(s, m, c);
  Plan mixed = uniform;
  mixed.layers[11].sequence_parallel = false;
  validate(mixed, m, c, "test");
  const int64_t pair = 24 * 12 * kMiB;
  for (int stage : {0, 1})
    BOOST_TEST(process_memory(m, c, mixed, stage).nccl_buffers_bytes ==
               process_memory(m, c, uniform, stage).nccl_buffers_bytes + pair);
}

BOOST_AUTO_TEST_CASE(device_memory_is_allocated_then_reserved_then_device) {
  ProcessMemory p;
  p.cuda_context_bytes = 400, p.nccl_buffers_bytes = 1000, p.cublas_workspace_bytes = 100;
  const DeviceMemory d = device_memory(9900, p, 0.05);
  BOOST_TEST(d.allocated_bytes == 10000);  // tensors + cuBLAS (from the caching allocator)
  BOOST_TEST(d.fragmentation_bytes == 500);
  BOOST_TEST(d.reserved_bytes == 10500);
  BOOST_TEST(d.device_bytes == 10500 + 400 + 1000);  // + the CUDA context and NCCL
  // A cluster without a ledger (the CPU runtime's) adds nothing.
  const ClusterSpec cpu = load_cluster("cpu-local");
  BOOST_TEST(cpu.gpu.process.cuda_context_bytes == 0);
  BOOST_TEST(cpu.gpu.process.nccl_connection_bytes == 0);
}

BOOST_AUTO_TEST_CASE(estimate_and_simulate_report_the_ledger_and_both_peaks) {
  const std::string args =
      " --model gpt2-124m --cluster dgx-h100 --nodes 1 --tp 2 --pp 2 --dp 2 --micro-batch 1 "
      "--global-batch 16 --json";
  for (const char* cmd : {"estimate", "simulate"}) {
    const test::RunResult r = test::run(std::string(cmd) + args);
    BOOST_TEST_CONTEXT(cmd << ": " << r.output.substr(0, 500)) {
      BOOST_REQUIRE(r.exit_code == 0);
      const nlohmann::json j = json_of(r);
      const nlohmann::json& m = j.at("memory_breakdown_bytes");
      for (const char* k : {"weights", "grads", "optimizer", "activations", "buffers",
                            "cublas_workspace", "fragmentation", "cuda_context", "nccl_buffers"})
        BOOST_TEST(m.contains(k), k);
      BOOST_TEST(!m.contains("context"));
      int64_t sum = 0;
      for (const auto& [k, v] : m.items()) sum += v.get<int64_t>();
      BOOST_TEST(sum == j.at("peak_memory_bytes").get<int64_t>());
      BOOST_TEST(m.at("nccl_buffers").get<int64_t>() > 0);
      BOOST_TEST(m.at("cuda_context").get<int64_t>() == 400 * kMiB);
      const int64_t allocated = j.at("peak_allocated_bytes"),
                    reserved = j.at("peak_reserved_bytes");
      BOOST_TEST(allocated > 0);
      BOOST_TEST(allocated < reserved);
      BOOST_TEST(reserved < j.at("peak_memory_bytes").get<int64_t>());
    }
  }
  // The simulator's peak is the estimator's, part by part.
  const nlohmann::json e = json_of(test::run("estimate" + args));
  const nlohmann::json s = json_of(test::run("simulate" + args));
  BOOST_TEST(e.at("memory_breakdown_bytes") == s.at("memory_breakdown_bytes"));
  BOOST_TEST(e.at("peak_reserved_bytes") == s.at("peak_reserved_bytes"));
  BOOST_TEST(e.at("peak_allocated_bytes") == s.at("peak_allocated_bytes"));
}

BOOST_AUTO_TEST_CASE(a_peak_within_five_percent_of_the_gpu_memory_is_warned_once) {
  const std::string plan =
      " --model gpt2-124m --nodes 1 --tp 2 --pp 2 --dp 2 --micro-batch 1 --global-batch 16";
  const int64_t peak =
      json_of(test::run("estimate --cluster dgx-a100-80g --json" + plan)).at("peak_memory_bytes");
  EditedClusters tmp;
  const std::string near = tmp.write(
      "near", [&](nlohmann::json& j) { j["gpu"]["hbm_bytes"] = int64_t(double(peak) / 0.97); });
  const std::string roomy = tmp.write(
      "roomy", [&](nlohmann::json& j) { j["gpu"]["hbm_bytes"] = int64_t(double(peak) / 0.90); });
  for (const char* cmd : {"estimate", "simulate"}) {
    const test::RunResult r = test::run(std::string(cmd) + " --cluster " + near + plan);
    BOOST_TEST_CONTEXT(cmd << ": " << r.output.substr(0, 2000)) {
      BOOST_TEST(r.exit_code == 0);
      const std::string needle = std::string("stratagem ") + cmd + ": warning: the forecast peak";
      const size_t at = r.output.find(needle);
      BOOST_TEST(at != std::string::npos);
      BOOST_TEST(r.output.find(needle, at + 1) == std::string::npos);  // once
      BOOST_TEST(r.output.find("is within 5% of the") != std::string::npos);
    }
    const test::RunResult ok = test::run(std::string(cmd) + " --cluster " + roomy + plan);
    BOOST_TEST(ok.exit_code == 0);
    BOOST_TEST(ok.output.find("warning") == std::string::npos, ok.output.substr(0, 500));
  }
}

BOOST_AUTO_TEST_CASE(the_old_context_key_is_refused_in_one_line) {
  EditedClusters tmp;
  const std::string old =
      tmp.write("old", [](nlohmann::json& j) { j["gpu"]["context_overhead_bytes"] = 1342177280; });
  const test::RunResult r = test::run("estimate --model gpt2-124m --nodes 1 --cluster " + old);
  BOOST_TEST(r.exit_code == kExitBadInput);
  BOOST_TEST(r.output.find("gpu.context_overhead_bytes") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("gpu.process") != std::string::npos, r.output);
  BOOST_TEST(r.output.find('\n') == r.output.size() - 1, r.output);
  // A ledger stated in part is refused, naming the missing key.
  const std::string part = tmp.write(
      "part", [](nlohmann::json& j) { j["gpu"]["process"]["nccl"].erase("connection_bytes"); });
  const test::RunResult p = test::run("estimate --model gpt2-124m --nodes 1 --cluster " + part);
  BOOST_TEST(p.exit_code == kExitBadInput);
  BOOST_TEST(p.output.find("connection_bytes") != std::string::npos, p.output);
}
