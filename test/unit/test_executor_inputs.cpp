// What reaches the executor from outside its Program: each op of a layer carries the layer's
// recompute (the executor keeps what the op says, not what it reads in the plan), and the
// framework file the run names builds the Program; a framework whose Program the executor
// cannot run is refused before any work.
#define BOOST_TEST_MODULE executor_inputs
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <fstream>
#include <string>

#include "stratagem/error.hpp"
#include "stratagem/executor.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/program.hpp"

using namespace stratagem;

namespace {
ModelSpec tiny_gpt() {
  ModelSpec m;
  m.name = "tiny";
  m.layers = 4, m.hidden = 64, m.heads = 4, m.kv_heads = 4, m.ffn_hidden = 256;
  m.vocab = 256, m.seq_len = 32;
  return m;
}

ClusterSpec cpu_cluster() {
  ClusterSpec c = load_cluster("cpu-local");
  c.nodes = 1;
  return c;
}

Plan plan_of(int dp, int zero, const ModelSpec& m, const ClusterSpec& c) {
  PlanShorthand s;
  s.dp = dp, s.pp = 1, s.tp = 1, s.micro_batch = 1, s.global_batch = 2 * dp, s.zero = zero;
  s.dtype = "fp32";
  return expand_shorthand(s, m, c);
}

// A framework file like the runtime's own, with layer_gradient_staging as given.
std::string framework_file(bool staging) {
  const std::string path = std::string("executor_inputs_fw_") + (staging ? "1" : "0") + ".json";
  std::ofstream(path) << R"({"name": "bucketed", "gradients": {"wgrad_accumulation_fused": true,
    "accumulation_bytes": 4, "layer_gradient_staging": )"
                      << (staging ? "true" : "false") << "}}\n";
  return path;
}
}  // namespace

BOOST_AUTO_TEST_CASE(ops_of_a_layer_carry_its_recompute) {
  const ModelSpec m = tiny_gpt();
  const ClusterSpec c = cpu_cluster();
  Plan p = plan_of(2, 1, m, c);
  const Recompute by_layer[] = {Recompute::none, Recompute::selective, Recompute::full,
                                Recompute::none};
  for (int l = 0; l < m.layers; ++l) p.layers[l].recompute = by_layer[l];
  const Program prog = build_program(m, p, load_framework(kRuntimeFramework));
  int recomputed = 0;
  for (const StageProgram& sp : prog.stages)
    for (const Op& op : sp.ops) {
      const Recompute expected = op.layer >= 0 ? by_layer[op.layer] : Recompute::none;
      BOOST_TEST_REQUIRE((op.recompute == expected),
                         op_name(op) << " carries recompute " << to_string(op.recompute));
      recomputed += op.phase == Phase::recompute;
    }
  BOOST_TEST(recomputed > 0);  // the plan's recompute made ops that rebuild
}

BOOST_AUTO_TEST_CASE(runtime_framework_builds_the_staged_program) {
  const ModelSpec m = tiny_gpt();
  const ClusterSpec c = cpu_cluster();
  const FrameworkSpec fw = load_framework(kRuntimeFramework);
  BOOST_TEST(fw.layer_gradient_staging);  // data/frameworks/stratagem.json says so
  const Plan p = plan_of(2, 2, m, c);
  // Under ZeRO-2 the staged Program holds each layer's gradients in buffers of category grads
  // outside the setup phase; without staging it has none.
  auto staged_buffers = [&](const FrameworkSpec& f) {
    int n = 0;
    const Program prog = build_program(m, p, f);
    for (const Op& op : prog.stages[0].ops)
      n +=
          op.kind == OpKind::alloc && op.category == MemCategory::grads && op.phase != Phase::setup;
    return n;
  };
  BOOST_TEST(staged_buffers(fw) > 0);
  BOOST_TEST(staged_buffers(FrameworkSpec{}) == 0);
}

BOOST_AUTO_TEST_CASE(a_framework_the_executor_cannot_run_is_refused) {
  const ModelSpec m = tiny_gpt();
  const ClusterSpec c = cpu_cluster();
  const std::string bucketed = framework_file(false), staged = framework_file(true);
  // ZeRO-2 over dp 2 stages gradients: a framework without staging is refused, naming it.
  const Plan z2 = plan_of(2, 2, m, c);
  try {
    check_runnable(m, z2, c, "cpu", bucketed);
    BOOST_FAIL("a framework without layer_gradient_staging ran under ZeRO-2");
  } catch (const NotSupported& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find("framework bucketed") != std::string::npos, what);
    BOOST_TEST(what.find("layer_gradient_staging") != std::string::npos, what);
  }
  BOOST_CHECK_NO_THROW(check_runnable(m, z2, c, "cpu", staged));
  BOOST_CHECK_NO_THROW(check_runnable(m, z2, c, "cpu"));  // the runtime's own file
  // ZeRO-1 stages nothing: any framework builds a Program the executor runs.
  BOOST_CHECK_NO_THROW(check_runnable(m, plan_of(2, 1, m, c), c, "cpu", bucketed));
  std::remove(bucketed.c_str());
  std::remove(staged.c_str());
}
