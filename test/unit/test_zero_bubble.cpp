// The zero-bubble schedules (zb-h1, zb-h2) against the paper's own arithmetic: from its
// profiled T_F, T_B, T_W and T_comm (Qi et al., ICLR'24, "Zero Bubble (Almost) Pipeline
// Parallelism", Table 6 inputs; Table 5 bubble rates), the simulator running the Programs of
// the one schedule generator gives the bubble rates the paper's Table 5 prints, for 1F1B,
// interleaved 1F1B, ZB-H1 and ZB-H2 on every setting it lists. And the split's bookkeeping:
// each schedule's pass order, memory per stage, and the split's costs summing to the whole.
#define BOOST_TEST_MODULE zero_bubble
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "stratagem/cost.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/program.hpp"
#include "stratagem/schedule.hpp"
#include "stratagem/search.hpp"
#include "stratagem/simulate.hpp"
#include "test/support/cli_json.hpp"
#include "test/support/run.hpp"

using namespace stratagem;

namespace {

// One row of the paper's Table 5 (ICLR'24; arXiv 2401.10241 Table 5): the pipeline, the number
// of micro-batches, the profiled times (Table 6: the unit does not matter, only ratios), the
// layers the authors' script gives interleaving (efficiency.py, iclr_bubble_rates: l / p
// chunks a stage) and the printed bubble rates.
struct PaperRow {
  int p, m;
  double f, b, w, c;
  int l;
  double r_1f1b, r_interleaved, r_h1, r_h2;
};
const PaperRow kTable5[] = {
    {8, 24, 18.522, 18.086, 9.337, 0.601, 24, 0.2431, 0.1055, 0.1585, 0.1083},
    {8, 32, 18.513, 18.086, 9.331, 0.626, 24, 0.1985, 0.0818, 0.1242, 0.0837},
    {8, 64, 18.546, 18.097, 9.321, 0.762, 24, 0.1240, 0.0443, 0.0674, 0.0444},
    {8, 24, 29.718, 29.444, 19.927, 0.527, 32, 0.2347, 0.0808, 0.1323, 0.0698},
    {8, 32, 29.802, 29.428, 19.530, 0.577, 32, 0.1898, 0.0628, 0.1045, 0.0559},
    {8, 64, 29.935, 29.621, 19.388, 0.535, 32, 0.1091, 0.0320, 0.0554, 0.0294},
    {16, 48, 11.347, 11.248, 8.132, 0.377, 48, 0.2552, 0.1104, 0.1397, 0.0672},
    {16, 64, 11.307, 11.254, 8.101, 0.379, 48, 0.2082, 0.0852, 0.1088, 0.0516},
    {16, 128, 11.325, 11.308, 8.109, 0.378, 48, 0.1251, 0.0445, 0.0576, 0.0266},
    {32, 96, 10.419, 10.207, 7.715, 0.408, 64, 0.2646, 0.1493, 0.1421, 0.0641},
    {32, 128, 10.408, 10.204, 7.703, 0.408, 64, 0.2168, 0.1164, 0.1106, 0.0490},
    {32, 256, 10.402, 10.248, 7.698, 0.460, 64, 0.1352, 0.0624, 0.0594, 0.0257},
};

// The paper's times on a layer's attention ops (in ms; everything else is free): F, and B and
// W, or B + W where the backward is whole; a pipeline send takes T_comm, as the edges of the
// authors' simulator do. With v layers a stage, each is a v-th.
struct PaperCosts : OpCosts {
  double f, b, w, c;
  int v;
  double compute_time_s(const Op& op) const override {
    if (op.kind != OpKind::compute || op.block != Block::attention || op.layer < 0) return 0;
    double t = 0;
    if (op.phase == Phase::forward) t = f;
    if (op.phase == Phase::backward) t = op.wgrad_deferred ? b : b + w;
    if (op.phase == Phase::weight_grad) t = w;
    return t * 1e-3 / v;
  }
  CommCost comm_cost(const Op& op, const Layout&, int) const override {
    CommCost x;
    if (op.kind == OpKind::send && op.purpose == Purpose::pipeline) x.latency_s = c * 1e-3;
    return x;
  }
};

ModelSpec model_of(int layers) {
  ModelSpec m;
  m.name = "paper";
  m.layers = layers, m.hidden = 64, m.heads = 2, m.kv_heads = 2, m.ffn_hidden = 256;
  m.vocab = 128, m.seq_len = 32;
  // Untied: a tied embedding's sum would join the first and last stages' ends.
  m.tied_embeddings = false;
  return m;
}

Plan plan_of(const ModelSpec& m, const ClusterSpec& c, int pp, int microbatches,
             const char* schedule, int vpp = 1) {
  PlanShorthand s;
  s.tp = 1, s.pp = pp, s.dp = 1, s.micro_batch = 1, s.global_batch = microbatches;
  s.schedule = std::string(schedule);
  if (vpp > 1) s.vpp = vpp;
  Plan p = expand_shorthand(s, m, c);
  validate(p, m, c, "test");
  return p;
}

ClusterSpec cluster_of(int gpus) {
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.node.gpus_per_node = gpus;
  c.nodes = 1;
  return c;
}

// The paper's bubble rate (its Section 5.3): (cost - m (T_F + T_B + T_W)) / cost, where cost
// is the longest stage: from the iteration's start, or for ZB-H2 from the stage's first
// forward (the authors' get_hand_schedule: ZB-H2 drops the optimizer's synchronization, so
// that its stages' work forms a parallelogram).
double bubble_rate(const PaperRow& row, const char* schedule, int layers, int vpp) {
  const ModelSpec m = model_of(layers);
  const ClusterSpec c = cluster_of(row.p);
  const Plan plan = plan_of(m, c, row.p, row.m, schedule, vpp);
  const Layout layout(plan, c);
  const Program prog = build_program(m, plan);
  PaperCosts costs;
  costs.f = row.f, costs.b = row.b, costs.w = row.w, costs.c = row.c, costs.v = vpp;
  SimOptions o;
  o.record_trace = true;
  o.interference = 1.0;
  const SimResult r = simulate(prog, layout, c, costs, o);
  BOOST_REQUIRE(!r.deadlock.deadlocked);
  const bool from_first_forward = std::string(schedule) == "zb-h2";
  double cost_ms = 0;
  for (size_t i = 0; i < r.trace_ranks.size(); ++i) {
    const StageProgram& sp = prog.stages[size_t(layout.coords(r.trace_ranks[i]).stage)];
    int64_t first = -1, last = 0;
    for (const SimOpSpan& s : r.trace_ops[i]) {
      const Op& op = sp.ops[s.op];
      if (op.kind != OpKind::compute) continue;
      if (first < 0 && op.block == Block::attention && op.phase == Phase::forward)
        first = s.start_ns;
      last = std::max(last, s.end_ns);
    }
    cost_ms = std::max(cost_ms, double(last - (from_first_forward ? first : 0)) * 1e-6);
  }
  const double ideal_ms = row.m * (row.f + row.b + row.w);
  return (cost_ms - ideal_ms) / cost_ms;
}

}  // namespace

// Table 5 prints four digits: a rate the simulator reproduces is within their rounding, 5e-5,
// and the nanosecond clock on ~1 s pipelines (1e-9 relative) adds nothing visible; 1e-4 holds
// both: ZB-H1 and ZB-H2, whose receives are posted ahead as the authors' script has them.
// 1F1B is Megatron-Core's, which waits on its combined send and receive, and interleaved 1F1B
// is Megatron-Core's, whose groups and cross-chunk transfers the script times its own way:
// those within 0.01, as the issue asks of every schedule.
void expect_rate(double got, double paper, double tolerance, const char* what) {
  BOOST_TEST_MESSAGE(what << ": simulated " << got << ", paper " << paper);
  BOOST_TEST_INFO(what << ": simulated " << got << ", paper " << paper);
  BOOST_TEST(std::abs(got - paper) <= tolerance);
}

BOOST_AUTO_TEST_CASE(simulated_bubble_rates_are_the_papers_table_5) {
  for (const PaperRow& row : kTable5) {
    BOOST_TEST_CONTEXT("p=" << row.p << " m=" << row.m << " F=" << row.f) {
      expect_rate(bubble_rate(row, "1f1b", row.p, 1), row.r_1f1b, 0.01, "1f1b");
      expect_rate(bubble_rate(row, "zb-h1", row.p, 1), row.r_h1, 1e-4, "zb-h1");
      expect_rate(bubble_rate(row, "zb-h2", row.p, 1), row.r_h2, 1e-4, "zb-h2");
      expect_rate(bubble_rate(row, "interleaved", row.l, row.l / row.p), row.r_interleaved, 0.01,
                  "interleaved");
    }
  }
}

using stratagem::test::run_json;

// The estimator's closed forms and the simulator's run of the Program agree for each schedule:
// the same memory per category (the split's buffers included), and the iteration time within
// 3%, on dense plans with and without tensor and sequence parallelism, with each recompute.
BOOST_AUTO_TEST_CASE(estimator_and_simulator_agree_per_schedule) {
  const char* plans[] = {
      "--model gpt3-1.3b --cluster dgx-a100-80g --nodes 1 --pp 8 --tp 1 --dp 1 --micro-batch 1 "
      "--global-batch 32",
      "--model gpt3-1.3b --cluster dgx-a100-80g --nodes 1 --pp 4 --tp 2 --dp 1 --micro-batch 2 "
      "--global-batch 24 --sequence-parallel --recompute selective",
      "--model llama3-8b --cluster dgx-h100 --nodes 2 --pp 4 --tp 4 --dp 1 --micro-batch 1 "
      "--global-batch 16 --sequence-parallel --flash-attention --recompute full",
      "--model gpt3-1.3b --cluster dgx-a100-80g --nodes 1 --pp 2 --tp 1 --dp 4 --zero 1 "
      "--micro-batch 1 --global-batch 32",
  };
  for (const char* plan : plans)
    for (const char* sched : {"1f1b", "zb-h1", "zb-h2"}) {
      BOOST_TEST_CONTEXT(sched << ": " << plan) {
        const std::string args = std::string(plan) + " --schedule " + sched;
        const nlohmann::json e = run_json("estimate " + args);
        const nlohmann::json s = run_json("simulate " + args);
        BOOST_TEST(e["memory_breakdown_bytes"] == s["memory_breakdown_bytes"]);
        BOOST_TEST(e["peak_stage"] == s["peak_stage"]);
        const double te = e["iteration_time_s"], ts = s["iteration_time_s"];
        BOOST_TEST(std::abs(te - ts) / ts <= 0.03, te << " s estimated, " << ts << " s simulated");
      }
    }
}

// The pass order of each stage: every forward, B and W once, each B after its forward and each
// W after its B, W in micro-batch order, the warm-up and the held-back W as the paper's
// schedules have them, and its Fig. 3 (ZB-H2, p = 4, m = 8: the last stage runs F B with no
// W until its 7th pass, then W1, F8 B8, W2..W8).
BOOST_AUTO_TEST_CASE(pass_orders_are_the_papers) {
  for (Schedule sched : {Schedule::zb_h1, Schedule::zb_h2})
    for (int pp = 1; pp <= 6; ++pp)
      for (int m = 1; m <= 14; ++m)
        for (int s = 0; s < pp; ++s) {
          BOOST_TEST_CONTEXT(to_string(sched) << " pp=" << pp << " m=" << m << " stage " << s) {
            const ScheduleShape shape{pp, 1, sched, m, 0};
            std::vector<int> f_at(m, -1), b_at(m, -1), w_at(m, -1);
            int leading = 0, at = 0, next_w = 0, most_held = 0, held = 0;
            bool only_forwards = true;
            for (const PassStep& p : stage_schedule(shape, s)) {
              BOOST_TEST(p.chunk == s);
              int& slot = p.weight    ? w_at[p.microbatch]
                          : p.forward ? f_at[p.microbatch]
                                      : b_at[p.microbatch];
              BOOST_TEST(slot == -1);
              slot = at++;
              if (p.weight) BOOST_TEST(p.microbatch == next_w++);
              held += p.weight ? -1 : p.forward ? 0 : 1;
              most_held = std::max(most_held, held);
              only_forwards = only_forwards && p.forward;
              if (only_forwards) ++leading;
            }
            for (int k = 0; k < m; ++k) {
              BOOST_TEST(f_at[k] >= 0);
              BOOST_TEST(b_at[k] > f_at[k]);
              BOOST_TEST(w_at[k] > b_at[k]);
            }
            BOOST_TEST(leading == std::min(m, shape.warmup_forwards(s) + 1));
            // Held-back W at most: the deferred ones, and the one just after its B.
            BOOST_TEST(most_held <= shape.deferred_weights(s) + 1);
          }
        }
  std::string last;
  for (const PassStep& p : stage_schedule({4, 1, Schedule::zb_h2, 8, 0}, 3))
    last += (p.weight ? "W" : p.forward ? "F" : "B") + std::to_string(p.microbatch + 1) + " ";
  BOOST_TEST(last == "F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7 W1 F8 B8 W2 W3 W4 W5 W6 W7 W8 ");
}

// What the split is not built for is refused with exit 2 naming the field, and the exports say
// that Megatron-LM and torchtitan have no such schedule; --nearest gives 1F1B with both
// forecasts.
BOOST_AUTO_TEST_CASE(refusals_and_exports_name_the_schedule) {
  const std::string base =
      "estimate --cluster dgx-h100 --nodes 2 --global-batch 64 --schedule zb-h1 ";
  const std::pair<const char*, const char*> refused[] = {
      {"--model mixtral-8x7b --pp 2 --ep 8",
       "layers[0].schedule: schedule zb-h1: the split backward of MoE"},
      {"--model gpt3-1.3b --pp 2 --dp 8 --zero 2", "layers[0].zero"},
      {"--model llama3-8b --pp 2 --cp 2 --tp 2 --flash-attention", "layers[0].cp"},
      {"--model gpt3-1.3b --pp 2 --dp 8 --offload activations", "layers[0].offload"},
  };
  test::RunResult r;
  for (const auto& [flags, says] : refused) {
    BOOST_TEST_CONTEXT(flags) {
      BOOST_TEST((r = test::run(base + flags)).exit_code == 2);
      BOOST_TEST(r.output.find(says) != std::string::npos, r.output);
    }
  }
  const std::string plan =
      "--model gpt3-1.3b --cluster dgx-a100-80g --nodes 1 --pp 4 --dp 2 --global-batch 32 "
      "--schedule zb-h1 -o " +
      (std::filesystem::temp_directory_path() / ("zb_export_" + std::to_string(::getpid())))
          .string();
  BOOST_TEST((r = test::run("export --to megatron " + plan)).exit_code == 2);
  BOOST_TEST(r.output.find("cannot express the zb-h1 schedule") != std::string::npos, r.output);
  BOOST_TEST((r = test::run("export --to torchtitan " + plan)).exit_code == 2);
  BOOST_TEST(r.output.find("cannot express the zb-h1 schedule") != std::string::npos, r.output);
  BOOST_TEST((r = test::run("export --to megatron --nearest " + plan)).exit_code == 0);
  BOOST_TEST(r.output.find("exported: pp4 1f1b") != std::string::npos, r.output);
  BOOST_TEST(r.output.find("forecast (estimate)") != std::string::npos, r.output);
  std::filesystem::remove(std::filesystem::temp_directory_path() /
                          ("zb_export_" + std::to_string(::getpid())));
}

// The search tries zb-h1 and zb-h2 on its best 1F1B plans and keeps them only where they win and
// fit: on a pipeline of small stages (GPT-3 1.3B, pp 8 forced, no tp, 32 micro-batches) the best
// plan is a zero-bubble one, faster by the estimator than the best 1F1B plan of the same search
// without them, and within the budget. (Interleaving is left out: on this pipeline it wins.)
BOOST_AUTO_TEST_CASE(the_search_picks_a_zero_bubble_schedule_where_it_wins) {
  const ModelSpec m = load_model("gpt3-1.3b");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 1;
  SearchOptions o;
  o.global_batch = 32;
  o.pp_degrees = {8};
  o.tp_degrees = {1};
  o.zero_stages = {0};
  o.recompute = {Recompute::none};
  o.offload = false;
  o.rerank_with_simulator = false;
  o.schedules = {Schedule::one_f_one_b, Schedule::zb_h1, Schedule::zb_h2};
  const SearchResult with = search(m, c, o);
  BOOST_TEST(splits_backward(with.best.plan.schedule), with.best.plan.describe());
  BOOST_TEST(with.best.est_peak_memory_bytes <= with.memory_budget_bytes);
  o.schedules = {Schedule::one_f_one_b};
  const SearchResult without = search(m, c, o);
  BOOST_TEST(!splits_backward(without.best.plan.schedule));
  BOOST_TEST(with.best.est_iteration_time_s < without.best.est_iteration_time_s);
  // The winner is the best 1F1B plan with the schedule changed: the same stages and layers.
  BOOST_TEST(with.best.plan.chunks == without.best.plan.chunks);
}
