// The report's reading of a trace against the simulator's own figures: every rank's compute time
// is the simulator's busy time, compute + exposed communication + bubble is the iteration, the
// timeline blocks hold every op of their row exactly once, the memory ranks are each stage's
// most loaded; and the page holds one chart and one balance row per stage.
#define BOOST_TEST_MODULE report
#include <boost/test/unit_test.hpp>
#include <cstring>
#include <filesystem>
#include <map>

#include "src/report/trace_data.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/simulate.hpp"

using namespace stratagem;
namespace fs = std::filesystem;

namespace {

trace::OpRecord record(const char* name, OpKind k, Stream s) {
  trace::OpRecord r;
  std::strncpy(r.name, name, trace::kNameBytes - 1);
  r.kind = uint8_t(k);
  r.stream = uint8_t(s);
  return r;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

BOOST_AUTO_TEST_CASE(op_classes) {
  using report::classify;
  using report::OpClass;
  BOOST_TEST(int(classify(record("L3.attention.fwd.compute mb0", OpKind::compute,
                                 Stream::compute))) == int(OpClass::forward));
  BOOST_TEST(int(classify(record("L3.mlp.bwd.compute mb7", OpKind::compute, Stream::compute))) ==
             int(OpClass::backward));
  BOOST_TEST(int(classify(record("L0.attention.recompute.compute mb1", OpKind::compute,
                                 Stream::compute))) == int(OpClass::recompute));
  BOOST_TEST(int(classify(record("optimizer.opt.compute", OpKind::compute, Stream::compute))) ==
             int(OpClass::optimizer));
  BOOST_TEST(int(classify(record("L1.mlp.fwd.all_reduce mb0", OpKind::collective,
                                 Stream::tp_comm))) == int(OpClass::tp_comm));
  BOOST_TEST(int(classify(record("L1.mlp.bwd.all_reduce", OpKind::collective, Stream::dp_comm))) ==
             int(OpClass::dp_comm));
  BOOST_TEST(int(classify(record("L5.mlp.fwd.send mb2", OpKind::send, Stream::pp_comm))) ==
             int(OpClass::pp_comm));
  BOOST_TEST(int(classify(record("L5.mlp.fwd.copy_d2h mb2", OpKind::copy_d2h, Stream::d2h))) ==
             int(OpClass::offload));
  BOOST_TEST(int(classify(record("L3.router.fwd.all_to_all mb1", OpKind::collective,
                                 Stream::ep_comm))) == int(OpClass::ep_comm));
  // A split backward's W apart from its B; a posted pipeline receive is pipeline traffic.
  BOOST_TEST(int(classify(record("L2.mlp.wgrad.compute mb3", OpKind::compute, Stream::compute))) ==
             int(OpClass::weight_grad));
  BOOST_TEST(int(classify(record("L2.attention.bwd.recv mb3", OpKind::recv, Stream::pp_recv))) ==
             int(OpClass::pp_comm));
}

BOOST_AUTO_TEST_CASE(trace_figures_match_the_simulator) {
  const fs::path dir =
      fs::temp_directory_path() / ("stratagem_report_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "t.h5").string();
  ModelSpec m = load_model("gpt2-124m");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 1;
  PlanShorthand s;
  s.tp = 2, s.pp = 2, s.dp = 2, s.micro_batch = 1, s.global_batch = 8;
  s.recompute = "selective";
  const Plan p = expand_shorthand(s, m, c);
  const Layout L(p, c);
  const Program prog = build_program(m, p);
  const CostModel cost(m, c, p.dtype);
  SimOptions o;
  o.record_trace = true;
  const SimResult r = simulate(prog, L, c, CostModelCosts(cost, p), o);
  write_trace(path, r, m, c, p, prog, MPI_COMM_NULL);

  const report::TraceData d = report::read_trace(path, {5});
  BOOST_TEST(d.ranks.size() == 8u);
  BOOST_TEST(d.pp == 2);
  BOOST_TEST(d.t1_ns - d.t0_ns == r.makespan_ns);
  for (const auto& f : d.ranks) {
    const auto& x = r.ranks[f.rank];
    BOOST_TEST(f.busy_ns == x.compute_ns + x.recompute_ns + x.optimizer_ns);
    BOOST_TEST(f.busy_ns + f.exposed_comm_ns + f.bubble_ns == r.makespan_ns);
    BOOST_TEST(f.exposed_comm_ns >= 0);
    BOOST_TEST(f.bubble_ns >= 0);
    BOOST_TEST(f.peak_bytes == x.peak_memory_bytes);
    BOOST_TEST(f.stage == x.stage);
  }
  // Up to 32 ranks every rank is drawn; --ranks adds a view.
  BOOST_REQUIRE(d.views.size() == 2u);
  BOOST_TEST(d.views[0].ranks == std::vector<int>({0, 1, 2, 3, 4, 5, 6, 7}));
  BOOST_TEST(d.views[1].ranks == std::vector<int>({5}));
  // Blocks: every non-memory op of a row in exactly one block, in order, not overlapping.
  trace::Reader in(path);
  for (const auto& row : d.rows) {
    int64_t ops = 0;
    for (const auto& op : in.ops(row.rank))
      ops += op.stream == row.stream && op.kind != uint8_t(OpKind::alloc) &&
             op.kind != uint8_t(OpKind::free);
    int64_t in_blocks = 0, at = INT64_MIN;
    for (const auto& b : row.blocks) {
      in_blocks += b.ops;
      BOOST_TEST(b.start_ns >= at);
      BOOST_TEST(b.end_ns >= b.start_ns);
      at = b.end_ns;
    }
    BOOST_TEST(in_blocks == ops);
  }
  // Memory: the most-loaded rank of each stage.
  BOOST_REQUIRE(d.memory_ranks.size() == 2u);
  for (int st = 0; st < 2; ++st) {
    int64_t best = -1;
    for (const auto& x : r.ranks)
      if (x.stage == st) best = std::max(best, x.peak_memory_bytes);
    BOOST_TEST(r.ranks[d.memory_ranks[st]].peak_memory_bytes == best);
    BOOST_TEST(d.memory[st].size() > 0u);
  }
  // The page: one memory chart and one balance row per stage, nothing loaded from elsewhere.
  report::ReportInputs ri;
  ri.trace = path;
  ri.date = "test";
  const std::string html = report::render_html(ri);
  BOOST_TEST(count(html, "<svg class=\"mem-chart\"") == 2u);
  BOOST_TEST(count(html, "<g class=\"balance-row\"") == 2u);
  BOOST_TEST(count(html, "id=\"timeline-data\"") == 1u);
  BOOST_TEST(count(html, "https://") == 0u);
  BOOST_TEST(count(html, "<script src") == 0u);
  fs::remove_all(dir);
}
