// The fast analytical estimator: per-stage micro-batch times from the cost model's op costs,
// composed in closed form by the pipeline schedule, plus the end-of-iteration tail.
#include "stratagem/estimate.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "src/cost/plan_costs.hpp"
#include "stratagem/schedule.hpp"

namespace stratagem {

namespace {

using cost_detail::StageCost;

// The pipeline's steady state: the stage that sets the pace and what the others add.
struct Pace {
  int crit = 0;            // the stage whose micro-batch cycle is longest
  double crit_cycle = -1;  // its cycle: its pass and its share of the pipeline transfers
  double gpu_crit = 0;     // its pass on the GPU alone
  double fill_p2p = 0;     // pipeline transfers filling and draining, in chunks of 1/v
  double bubble_s = 0;     // the other stages' passes filling and draining
  double pipeline_s = 0;   // the m micro-batches through the pipeline
};

// A micro-batch on each stage: its kernels and the collectives compute waits for, then what the
// side streams (ZeRO-3 gathers, offload copies) could not hide behind them; sets each stage's
// time_per_microbatch_s.
// A split backward (zb-h1, zb-h2) fills the bubble of each other stage with W: (lag + 1) W of
// its pass do not leave it idle (the paper's Table 2: (p - 1)(T_F + T_B - T_W) for ZB-H1,
// (p - 1)(T_F + T_B - 2 T_W) for ZB-H2, against 1F1B's (p - 1)(T_F + T_B + T_W)).
Pace pace(const CostModel& cost, const std::vector<StageCost>& sc, const ScheduleShape& shape,
          Estimate& est) {
  const int v = shape.vpp, M = shape.microbatches;
  const int filled = shape.split() ? shape.weight_lag() + 1 : 0;
  double fill_sum = 0, fill_crit = 0;
  Pace x;
  for (int s = 0; s < int(sc.size()); ++s) {
    const StageCost& st = sc[s];
    const double gpu =
        cost.overlapped_time_s(st.fwd_s + st.bwd_s + st.rec_s, st.tp_s + st.ep_s + st.cp_s,
                               st.dp_stream_s, std::max(st.h2d_stream_s, st.d2h_stream_s)) +
        st.first_fetch_s;
    // The host issues a micro-batch's work ahead of the GPU; where it takes longer than the GPU
    // runs, the GPU waits for it (its collectives run while the host issues).
    const double u = std::max(gpu, st.host_issue_s);
    // In the steady state every micro-batch waits once for a pipeline transfer: the round trip
    // of an activation and its gradient spans two micro-batch cycles.
    const double cycle = u + 0.5 * (st.p2p_fwd_s + st.p2p_bwd_s);
    est.stages[s].time_per_microbatch_s = u;
    const double fill = std::max(0.0, gpu - filled * st.weight_grad_s);
    fill_sum += fill;
    x.fill_p2p += (st.p2p_fwd_s + st.p2p_bwd_s) / v;
    if (cycle > x.crit_cycle) x.crit_cycle = cycle, x.crit = s, x.gpu_crit = gpu, fill_crit = fill;
  }
  // The slowest stage sets the pace of the m micro-batches; the others' passes fill and drain
  // the pipeline, in chunks of 1/v of a stage under the interleaved schedule. Their GPU time
  // only: a host that paces a stage issues its next micro-batches while it waits for the
  // pipeline to fill, as the simulator's run of the Program shows.
  x.bubble_s = (fill_sum - fill_crit) / v;
  x.pipeline_s = M * x.crit_cycle + x.bubble_s + x.fill_p2p;
  return x;
}

// After its last backward each stage reduces gradients and steps the optimizer. Stage s's last
// backward ends earlier than stage 0's by the backward passes of the stages before it. Under a
// split backward those are B, and each stage then runs the W it held back and its last one.
struct Tail {
  int stage = 0;       // the stage whose tail ends last
  double s = 0;        // how far it ends beyond the pipeline
  double slack_s = 0;  // how much earlier than stage 0's its last backward ended
};
Tail tail(const std::vector<StageCost>& sc, const ScheduleShape& shape) {
  const int pp = int(sc.size()), v = shape.vpp;
  double slack = 0, worst = -1e300;
  Tail t;
  for (int s = 0; s < pp; ++s) {
    const StageCost& x = sc[s];
    const double end = x.reduce_exposed_s + std::max(x.optimizer_s + x.gather_s, x.host_s);
    // W after the last B: stage s's held ones and its last, against stage 0's last one.
    const double late =
        shape.split() ? (1 + shape.deferred_weights(s)) * x.weight_grad_s - sc[0].weight_grad_s
                      : 0.0;
    if (end - slack + late > worst)
      worst = end - slack + late, t.stage = s, t.slack_s = slack - late;
    if (s + 1 < pp)
      slack += (x.bwd_s - x.weight_grad_s + x.rec_s + x.tp_bwd_s + x.ep_bwd_s + x.cp_bwd_s +
                sc[s + 1].p2p_bwd_s) /
               v;
  }
  t.s = std::max(0.0, worst);
  return t;
}

// The critical stage's m micro-batches, the bubble, the tail.
TimeBreakdown breakdown(const std::vector<StageCost>& sc, const Pace& pc, const Tail& tl,
                        double u_crit, int M) {
  TimeBreakdown tb;
  {
    const StageCost& x = sc[pc.crit];
    const double busy = x.fwd_s + x.bwd_s + x.rec_s + x.tp_s + x.ep_s + x.cp_s;
    // The pass beyond its kernels and critical collectives is side-stream traffic that was not
    // hidden. Where the host paces the stage, everything beyond the kernels is the wait for it:
    // the collectives run while the host issues the next ops.
    const bool host_bound = u_crit > pc.gpu_crit;
    const double kernels = x.fwd_s + x.bwd_s + x.rec_s;
    const double host_wait = host_bound ? u_crit - kernels : 0.0;
    const double hidden = host_bound ? 0.0 : u_crit - busy;
    const double exposed_mbs = host_bound ? 0.0 : M;  // micro-batches whose collectives show
    tb.compute_s = M * (x.fwd_s + x.bwd_s);
    tb.recompute_s = M * x.rec_s;
    tb.tp_comm_s = exposed_mbs * x.tp_s;
    tb.ep_comm_s = exposed_mbs * x.ep_s;
    tb.cp_comm_s = exposed_mbs * x.cp_s;
    (x.dp_stream_s >= std::max(x.h2d_stream_s, x.d2h_stream_s) ? tb.dp_comm_s : tb.offload_s) +=
        M * hidden;
    tb.host_s = M * host_wait;
    tb.pp_comm_s = M * (pc.crit_cycle - u_crit) + pc.fill_p2p;
    tb.bubble_s = pc.bubble_s;
  }
  const StageCost& x = sc[tl.stage];
  double dp = x.reduce_exposed_s, opt = 0, off = 0;
  if (x.host_s > x.optimizer_s + x.gather_s)
    off = x.host_s;
  else
    opt = x.optimizer_s, dp += x.gather_s;
  // A stage whose held-back W end after stage 0's last pass: its tail starts that much later,
  // time the pipeline's shape leaves idle elsewhere.
  if (tl.slack_s < 0) tb.bubble_s -= tl.slack_s;
  double left = std::max(0.0, tl.slack_s);
  for (double* part : {&dp, &opt, &off}) {
    const double cut = std::min(*part, left);
    *part -= cut, left -= cut;
  }
  tb.dp_comm_s += dp;
  tb.optimizer_s += opt;
  tb.offload_s += off;
  return tb;
}

// Each stage's memory, and the peak stage's.
void memory(const std::vector<StageCost>& sc, Estimate& est) {
  for (int s = 0; s < int(sc.size()); ++s) {
    StageEstimate& se = est.stages[s];
    se.memory = sc[s].memory;
    se.peak_memory_bytes = se.memory.total_bytes();
    est.peak_allocated_bytes = std::max(est.peak_allocated_bytes, se.memory.allocated_bytes());
    est.peak_reserved_bytes = std::max(est.peak_reserved_bytes, se.memory.reserved_bytes());
    if (se.peak_memory_bytes > est.peak_memory_bytes) {
      est.peak_memory_bytes = se.peak_memory_bytes;
      est.peak_stage = s;
      est.memory = se.memory;
    }
  }
}

}  // namespace

Estimate estimate(const CostModel& cost, const Plan& p) {
  thread_local std::vector<StageCost> sc;
  cost_detail::analyze(cost, p, /*with_time=*/true, sc);
  const int pp = p.pp;
  const int M = p.global_batch / (p.micro_batch * p.max_dp());

  Estimate est;
  est.stages.resize(pp);
  const ScheduleShape shape = ScheduleShape::of(p, M);
  const Pace pc = pace(cost, sc, shape, est);
  const Tail tl = tail(sc, shape);
  est.iteration_time_s = pc.pipeline_s + tl.s;
  est.time = breakdown(sc, pc, tl, est.stages[pc.crit].time_per_microbatch_s, M);

  const ModelSpec& m = cost.model();
  est.moe = m.moe.enabled();
  est.host_modelled = cost.framework().host_issue_modelled();
  est.tokens_per_s = double(p.global_batch) * m.seq_len / est.iteration_time_s;
  est.tflops_per_gpu =
      model_flops_per_iteration(m, p.global_batch) / est.iteration_time_s / p.world_size() / 1e12;
  est.mfu = est.tflops_per_gpu * 1e12 / cost.peak_flops();
  memory(sc, est);
  return est;
}

nlohmann::json memory_json(const MemoryBreakdown& m) {
  return {{"weights", m.weights_bytes},
          {"grads", m.grads_bytes},
          {"optimizer", m.optimizer_bytes},
          {"activations", m.activations_bytes},
          {"buffers", m.buffers_bytes},
          {"cublas_workspace", m.cublas_workspace_bytes},
          {"fragmentation", m.fragmentation_bytes},
          {"cuda_context", m.cuda_context_bytes},
          {"nccl_buffers", m.nccl_buffers_bytes}};
}

nlohmann::json to_json(const Estimate& e, bool context_parallel) {
  const TimeBreakdown& t = e.time;
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < e.stages.size(); ++s)
    stages.push_back({{"stage", s},
                      {"time_per_microbatch_s", e.stages[s].time_per_microbatch_s},
                      {"peak_memory_bytes", e.stages[s].peak_memory_bytes},
                      {"peak_reserved_bytes", e.stages[s].memory.reserved_bytes()},
                      {"peak_allocated_bytes", e.stages[s].memory.allocated_bytes()},
                      {"memory_breakdown_bytes", memory_json(e.stages[s].memory)}});
  nlohmann::json j = {{"iteration_time_s", e.iteration_time_s},
                      {"tokens_per_s", e.tokens_per_s},
                      {"tflops_per_gpu", e.tflops_per_gpu},
                      {"mfu", e.mfu},
                      {"peak_memory_bytes", e.peak_memory_bytes},
                      {"peak_reserved_bytes", e.peak_reserved_bytes},
                      {"peak_allocated_bytes", e.peak_allocated_bytes},
                      {"peak_stage", e.peak_stage},
                      {"memory_breakdown_bytes", memory_json(e.memory)},
                      {"time_breakdown_s",
                       {{"compute", t.compute_s},
                        {"recompute", t.recompute_s},
                        {"tp_comm", t.tp_comm_s},
                        {"dp_comm", t.dp_comm_s},
                        {"pp_comm", t.pp_comm_s},
                        {"bubble", t.bubble_s},
                        {"offload", t.offload_s},
                        {"optimizer", t.optimizer_s}}},
                      {"per_stage", stages}};
  // MoE models only, so that a dense plan's output is as before.
  if (e.moe) {
    j["time_breakdown_s"]["ep_comm"] = t.ep_comm_s;
    j["exposed_comm_s"] = {{"ep", t.ep_comm_s}};
  }
  // Context parallelism's part, only where the plan splits the sequence (a plan without it
  // reports as before).
  if (context_parallel) j["time_breakdown_s"]["cp_comm"] = t.cp_comm_s;
  // Only where the framework states its host time (a plan under any other prints as before).
  if (e.host_modelled) j["time_breakdown_s"]["host"] = t.host_s;
  return j;
}

}  // namespace stratagem
