// Simulator outputs: the HDF5 trace (round trip, independent of how it was produced), the
// Chrome trace-event export, the JSON report, and the CLI (simulate --json/--trace, trace export).
#define BOOST_TEST_MODULE sim_trace
#include <array>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "stratagem/cost.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/simulate.hpp"
#include "stratagem/trace.hpp"

using namespace stratagem;
namespace fs = std::filesystem;

namespace {

struct Tmp {
  fs::path dir;
  Tmp() {
    dir = fs::temp_directory_path() / ("stratagem_sim_trace_" + std::to_string(::getpid()));
    fs::create_directories(dir);
  }
  ~Tmp() { fs::remove_all(dir); }
  std::string operator()(const std::string& name) const { return (dir / name).string(); }
};

struct Setup {
  ModelSpec m = load_model("gpt2-124m");
  ClusterSpec c;
  Plan p;
  Setup() {
    c = load_cluster("dgx-a100-80g");
    c.nodes = 1;
    PlanShorthand s;
    s.tp = 2, s.pp = 2, s.dp = 2, s.micro_batch = 1, s.global_batch = 8;
    p = expand_shorthand(s, m, c);
    validate(p, m, c, "test");
  }
};

std::string run(const std::string& cmd, int* rc) {
  std::string out;
  std::FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  BOOST_REQUIRE(f);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  const int st = pclose(f);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::string bin() {
  const char* b = std::getenv("STRATAGEM_BIN");
  return b ? b : STRATAGEM_BIN;
}

// Checks a Chrome trace-event document; returns the number of "X" events per pid.
std::map<int, size_t> check_chrome(const nlohmann::json& j) {
  BOOST_REQUIRE(j.is_object());
  BOOST_REQUIRE(j.contains("traceEvents"));
  BOOST_REQUIRE(j["traceEvents"].is_array());
  std::map<int, size_t> xs;
  std::set<std::pair<int, int>> named_threads;
  std::set<int> named_procs;
  for (const auto& e : j["traceEvents"]) {
    BOOST_REQUIRE(e.contains("ph") && e["ph"].is_string());
    BOOST_REQUIRE(e.contains("pid") && e["pid"].is_number_integer());
    BOOST_REQUIRE(e.contains("name") && e["name"].is_string());
    const std::string ph = e["ph"];
    const int pid = e["pid"];
    if (ph == "X") {
      BOOST_REQUIRE(e.contains("tid") && e["tid"].is_number_integer());
      BOOST_REQUIRE(e.contains("ts") && e["ts"].is_number());
      BOOST_REQUIRE(e.contains("dur") && e["dur"].is_number());
      BOOST_TEST(e["dur"].get<double>() >= 0);
      BOOST_TEST(e["ts"].get<double>() >= 0);
      BOOST_TEST(e["tid"].get<int>() >= 0);
      BOOST_TEST(e["tid"].get<int>() < kNumStreams);
      ++xs[pid];
      BOOST_TEST(named_threads.count({pid, e["tid"].get<int>()}) == 1u);
    } else if (ph == "M") {
      BOOST_REQUIRE(e.contains("args"));
      if (e["name"] == "process_name") named_procs.insert(pid);
      if (e["name"] == "thread_name") named_threads.insert({pid, e["tid"].get<int>()});
    } else {
      BOOST_TEST(ph == "C");
      BOOST_TEST(e.contains("ts"));
    }
  }
  for (const auto& [pid, n] : xs) BOOST_TEST(named_procs.count(pid) == 1u);
  return xs;
}

}  // namespace

BOOST_AUTO_TEST_CASE(trace_round_trip_and_chrome_export) {
  Tmp tmp;
  Setup s;
  const Layout L(s.p, s.c);
  const Program prog = build_program(s.m, s.p);
  const CostModel cost(s.m, s.c, s.p.dtype);
  SimOptions o;
  o.record_trace = true;
  const SimResult r = simulate(prog, L, s.c, CostModelCosts(cost, s.p), o);
  BOOST_REQUIRE(!r.deadlock.deadlocked);
  write_trace(tmp("t.h5"), r, s.m, s.c, s.p, prog, MPI_COMM_NULL);

  trace::Reader in(tmp("t.h5"));
  BOOST_TEST(in.attribute("source") == "simulated");
  BOOST_TEST(!in.attribute("tool_version").empty());
  BOOST_TEST(nlohmann::json::parse(in.attribute("model"))["name"] == "gpt2-124m");
  BOOST_TEST(nlohmann::json::parse(in.attribute("plan"))["pp"] == 2);
  BOOST_TEST(nlohmann::json::parse(in.attribute("cluster"))["name"] == "dgx-a100-80g");
  BOOST_TEST(in.int_attribute("schema_version") == trace::kSchemaVersion);
  BOOST_TEST(in.ranks() == std::vector<int>({0, 1, 2, 3, 4, 5, 6, 7}));
  for (int rank = 0; rank < 8; ++rank) {
    const auto ops = in.ops(rank);
    const auto& sp = prog.stages[L.coords(rank).stage];
    BOOST_TEST(ops.size() == sp.ops.size());
    int64_t end = 0;
    for (const auto& op : ops) {
      BOOST_TEST(op.end_ns >= op.start_ns);
      end = std::max(end, op.end_ns);
      BOOST_TEST(op.kind <= uint8_t(OpKind::free));
    }
    BOOST_TEST(end == r.ranks[rank].end_ns);
    const auto mem = in.memory(rank);
    BOOST_TEST(!mem.empty());
    int64_t hw = 0;
    for (const auto& m : mem) hw = std::max(hw, m.total_bytes);
    BOOST_TEST(hw == r.ranks[rank].peak_memory_bytes);
    BOOST_TEST(mem.back().high_water_bytes == r.ranks[rank].peak_memory_bytes);
  }

  trace::export_chrome(tmp("t.h5"), tmp("t.json"));
  std::ifstream f(tmp("t.json"));
  const nlohmann::json j = nlohmann::json::parse(f);
  const auto xs = check_chrome(j);
  BOOST_TEST(xs.size() == 8u);
  for (const auto& [pid, n] : xs) BOOST_TEST(n == prog.stages[L.coords(pid).stage].ops.size());
}

BOOST_AUTO_TEST_CASE(json_report_has_the_estimate_keys) {
  Setup s;
  const Layout L(s.p, s.c);
  const Program prog = build_program(s.m, s.p);
  const CostModel cost(s.m, s.c, s.p.dtype);
  const SimResult r = simulate(prog, L, s.c, CostModelCosts(cost, s.p), {});
  const nlohmann::json j = to_json(r, s.m, s.c, s.p, prog);
  for (const char* k : {"iteration_time_s", "tokens_per_s", "tflops_per_gpu", "mfu",
                        "peak_memory_bytes", "memory_breakdown_bytes", "time_breakdown_s",
                        "per_rank", "events_processed", "bubble_fraction", "exposed_comm_s", "oom"})
    BOOST_TEST(j.contains(k), k);
  BOOST_TEST(j["oom"] == false);
  BOOST_TEST(j["per_rank"].size() == 8u);
  BOOST_TEST(j["mfu"].get<double>() > 0.0);
  BOOST_TEST(j["mfu"].get<double>() < 1.0);
  double sum = 0;
  for (auto& [k, v] : j["time_breakdown_s"].items()) sum += v.get<double>();
  BOOST_TEST(std::abs(sum - j["iteration_time_s"].get<double>()) < 1e-9);
  int64_t mem = 0;
  for (auto& [k, v] : j["memory_breakdown_bytes"].items()) mem += v.get<int64_t>();
  BOOST_TEST(mem == j["peak_memory_bytes"].get<int64_t>());
  for (const auto& pr : j["per_rank"]) {
    BOOST_TEST(pr.contains("peak_op"));
    BOOST_TEST(pr.contains("busy_s"));
    BOOST_TEST(pr.contains("idle_s"));
  }
}

BOOST_AUTO_TEST_CASE(cli_simulate_trace_and_chrome_export) {
  Tmp tmp;
  int rc = 0;
  const std::string plan =
      " --model gpt2-124m --cluster dgx-a100-80g --nodes 1 --tp 2 --pp 2 --dp 2 "
      "--micro-batch 1 --global-batch 8";
  std::string out = run(bin() + " simulate" + plan + " --json --trace " + tmp("c.h5"), &rc);
  BOOST_REQUIRE_MESSAGE(rc == 0, out);
  const auto j = nlohmann::json::parse(out);
  BOOST_TEST(j["iteration_time_s"].get<double>() > 0);
  BOOST_TEST(j["source"] == "simulated");
  out = run(bin() + " trace export " + tmp("c.h5") + " --chrome " + tmp("c.json"), &rc);
  BOOST_REQUIRE_MESSAGE(rc == 0, out);
  std::ifstream f(tmp("c.json"));
  const auto xs = check_chrome(nlohmann::json::parse(f));
  BOOST_TEST(xs.size() == 8u);
  out = run(bin() + " trace info " + tmp("c.h5") + " --json", &rc);
  BOOST_TEST(rc == 0);
  BOOST_TEST(nlohmann::json::parse(out)["ranks"] == 8);
  // Bad input: exit 2 with a message naming the flag or the file.
  out = run(bin() + " simulate" + plan + " --iterations 0", &rc);
  BOOST_TEST(rc == 2);
  BOOST_TEST(out.find("--iterations") != std::string::npos);
  out = run(bin() + " trace export " + tmp("missing.h5") + " --chrome " + tmp("x.json"), &rc);
  BOOST_TEST(rc == 2);
  BOOST_TEST(out.find("missing.h5") != std::string::npos);
  // Human-readable summary.
  out = run(bin() + " simulate" + plan, &rc);
  BOOST_TEST(rc == 0);
  BOOST_TEST(out.find("iteration") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(cli_framework_shows_in_estimate_simulate_search_and_trace) {
  Tmp tmp;
  int rc = 0;
  const std::string plan =
      " --model gpt2-124m --cluster dgx-a100-80g --nodes 1 --tp 2 --pp 2 --dp 2 "
      "--micro-batch 1 --global-batch 8";
  std::string out = run(bin() + " estimate" + plan + " --json", &rc);
  BOOST_REQUIRE_MESSAGE(rc == 0, out);
  const auto own = nlohmann::json::parse(out);
  BOOST_TEST(own["framework"] == "stratagem");
  out = run(bin() + " estimate" + plan + " --framework megatron-lm-2021 --json", &rc);
  BOOST_REQUIRE_MESSAGE(rc == 0, out);
  const auto mlm = nlohmann::json::parse(out);
  BOOST_TEST(mlm["framework"] == "megatron-lm-2021");
  // Its separate gradient-accumulation pass costs time the fused runtime does not spend.
  BOOST_TEST(mlm["iteration_time_s"].get<double>() > own["iteration_time_s"].get<double>());
  out = run(
      bin() + " simulate" + plan + " --framework megatron-lm-2021 --json --trace " + tmp("f.h5"),
      &rc);
  BOOST_REQUIRE_MESSAGE(rc == 0, out);
  BOOST_TEST(nlohmann::json::parse(out)["framework"] == "megatron-lm-2021");
  {
    trace::Reader r(tmp("f.h5"));
    BOOST_TEST(nlohmann::json::parse(r.attribute("framework"))["name"] == "megatron-lm-2021");
  }
  out = run(bin() + " estimate" + plan + " --framework megatron-lm-2021", &rc);
  BOOST_TEST(out.find("framework megatron-lm-2021") != std::string::npos);
  out = run(bin() +
                " search --model gpt2-124m --cluster dgx-a100-80g --nodes 1 --global-batch 8 "
                "--framework llm.c --rerank estimator --quiet --json",
            &rc);
  BOOST_REQUIRE_MESSAGE(rc == 0, out);
  BOOST_TEST(nlohmann::json::parse(out)["framework"] == "llm.c");
  // Bad input: exit 2 naming the flag.
  out = run(bin() + " estimate" + plan + " --framework no-such-software", &rc);
  BOOST_TEST(rc == 2);
  BOOST_TEST(out.find("--framework") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(cli_reports_out_of_memory_and_still_prints_results) {
  int rc = 0;
  // GPT-3 6.7B without any sharding on one 80 GB GPU's worth of pipeline stage does not fit.
  const std::string out =
      run(bin() +
              " simulate --model gpt3-6.7b --cluster dgx-a100-80g --nodes 1 --tp 1 "
              "--pp 1 --dp 8 --micro-batch 1 --global-batch 8 --json",
          &rc);
  BOOST_TEST(rc == 0);
  const auto at = out.find('{');
  BOOST_REQUIRE(at != std::string::npos);
  BOOST_TEST(out.find("out of memory: rank 0") != std::string::npos, out.substr(0, at));
  const auto j = nlohmann::json::parse(out.substr(at));
  BOOST_TEST(j["oom"].is_object());
  BOOST_TEST(j["oom"]["rank"] == 0);
  BOOST_TEST(j["oom"].contains("op"));
  BOOST_TEST(j["oom"].contains("time_s"));
  BOOST_TEST(j["iteration_time_s"].get<double>() > 0);
}
