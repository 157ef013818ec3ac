// What a simulation reports: the JSON figures (keys shared with `stratagem estimate --json`)
// and the HDF5 trace (gathered to process 0, which writes it serially).
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <stdexcept>

#include "stratagem/estimate.hpp"
#include "stratagem/simulate.hpp"
#include "stratagem/spec_json.hpp"
#include "stratagem/trace.hpp"
#include "stratagem/version.hpp"
#include "stratagem/workload.hpp"

namespace stratagem {

MemoryBreakdown peak_breakdown(const SimRankResult& x) {
  MemoryBreakdown m;
  m.weights_bytes = x.peak_by_category[int(MemCategory::weights)];
  m.grads_bytes = x.peak_by_category[int(MemCategory::grads)];
  m.optimizer_bytes = x.peak_by_category[int(MemCategory::optimizer)];
  m.activations_bytes = x.peak_by_category[int(MemCategory::activations)];
  m.buffers_bytes = x.peak_by_category[int(MemCategory::buffers)];
  m.cublas_workspace_bytes = x.peak_cublas_workspace_bytes;
  m.fragmentation_bytes = x.peak_fragmentation_bytes;
  m.cuda_context_bytes = x.peak_cuda_context_bytes;
  m.nccl_buffers_bytes = x.peak_nccl_buffers_bytes;
  return m;
}

nlohmann::json to_json(const SimResult& r, const ModelSpec& model, const ClusterSpec& cluster,
                       const Plan& plan, const Program& program) {
  const int K = std::max(1, r.iterations);
  const double iter = double(r.makespan_ns) * 1e-9 / K;
  const int world = plan.world_size();
  const double flops = model_flops_per_iteration(model, plan.global_batch);
  const double peak = cluster.gpu.peak_flops(plan.dtype);
  nlohmann::json j;
  j["iteration_time_s"] = iter;
  j["tokens_per_s"] = iter > 0 ? double(plan.global_batch) * model.seq_len / iter : 0.0;
  j["tflops_per_gpu"] = iter > 0 ? flops / iter / world / 1e12 : 0.0;
  j["mfu"] = iter > 0 && peak > 0 ? flops / (iter * world * peak) : 0.0;
  // The most-loaded rank (lowest rank on ties).
  const SimRankResult* top = nullptr;
  for (const auto& x : r.ranks)
    if (!top || x.peak_memory_bytes > top->peak_memory_bytes) top = &x;
  j["peak_memory_bytes"] = top ? top->peak_memory_bytes : 0;
  // The caching allocator's peaks, each the maximum over ranks (as estimate's).
  int64_t reserved = 0, allocated = 0;
  for (const auto& x : r.ranks)
    reserved = std::max(reserved, x.peak_reserved_bytes),
    allocated = std::max(allocated, x.peak_allocated_bytes);
  j["peak_reserved_bytes"] = reserved;
  j["peak_allocated_bytes"] = allocated;
  j["peak_rank"] = top ? top->rank : -1;
  j["peak_stage"] = top ? top->stage : -1;
  j["memory_breakdown_bytes"] = top ? memory_json(peak_breakdown(*top)) : nlohmann::json::object();
  // Mean over ranks of each rank's accounting, per iteration.
  double acc[11] = {};
  for (const auto& x : r.ranks) {
    const int64_t v[11] = {x.compute_ns, x.recompute_ns, x.tp_ns, x.dp_ns, x.pp_ns,  x.bubble_ns,
                           x.offload_ns, x.optimizer_ns, x.ep_ns, x.cp_ns, x.host_ns};
    for (int k = 0; k < 11; ++k) acc[k] += double(v[k]);
  }
  const double n = std::max<size_t>(1, r.ranks.size());
  for (double& a : acc) a = a / n * 1e-9 / K;
  j["time_breakdown_s"] = {{"compute", acc[0]}, {"recompute", acc[1]}, {"tp_comm", acc[2]},
                           {"dp_comm", acc[3]}, {"pp_comm", acc[4]},   {"bubble", acc[5]},
                           {"offload", acc[6]}, {"optimizer", acc[7]}};
  j["bubble_fraction"] = iter > 0 ? acc[5] / iter : 0.0;
  j["exposed_comm_s"] = {{"tp", acc[2]}, {"dp", acc[3]}, {"pp", acc[4]}, {"offload", acc[6]}};
  // MoE models only, so that a dense plan's output is as before.
  const bool moe = model.moe.enabled();
  if (moe) {
    j["time_breakdown_s"]["ep_comm"] = acc[8];
    j["exposed_comm_s"]["ep"] = acc[8];
  }
  // Context parallelism's part, only where the plan splits the sequence (a plan without it
  // reports as before).
  const bool cp = plan.embedding.cp > 1;
  if (cp) j["time_breakdown_s"]["cp_comm"] = acc[9], j["exposed_comm_s"]["cp"] = acc[9];
  // Only where the framework states its host time (a plan under any other prints as before).
  if (r.host_issue) j["time_breakdown_s"]["host"] = acc[10];
  nlohmann::json per = nlohmann::json::array();
  for (const auto& x : r.ranks) {
    const double busy = double(x.compute_ns + x.recompute_ns + x.optimizer_ns) * 1e-9 / K;
    nlohmann::json o = {
        {"rank", x.rank},
        {"stage", x.stage},
        {"peak_memory_bytes", x.peak_memory_bytes},
        {"peak_reserved_bytes", x.peak_reserved_bytes},
        {"peak_allocated_bytes", x.peak_allocated_bytes},
        {"peak_op_index", x.peak_op},
        {"peak_op", x.peak_op >= 0 ? op_name(program.stages[x.stage].ops[x.peak_op]) : "(start)"},
        {"peak_iteration", x.peak_iteration},
        {"peak_time_s", double(x.peak_time_ns) * 1e-9},
        {"busy_s", busy},
        {"idle_s", iter - busy},
        {"end_time_s", double(x.end_ns) * 1e-9},
        {"exposed_comm_s",
         {{"tp", double(x.tp_ns) * 1e-9 / K},
          {"dp", double(x.dp_ns) * 1e-9 / K},
          {"pp", double(x.pp_ns) * 1e-9 / K},
          {"offload", double(x.offload_ns) * 1e-9 / K}}},
        {"bubble_s", double(x.bubble_ns) * 1e-9 / K},
        {"ops", x.ops_executed}};
    if (moe) o["exposed_comm_s"]["ep"] = double(x.ep_ns) * 1e-9 / K;
    if (cp) o["exposed_comm_s"]["cp"] = double(x.cp_ns) * 1e-9 / K;
    per.push_back(std::move(o));
  }
  j["per_rank"] = std::move(per);
  j["events_processed"] = r.stats.ops_executed;
  j["mode"] = r.stats.symmetric ? "symmetric" : "full";
  j["simulated_ranks"] = r.stats.simulated_ranks;
  j["iterations"] = K;
  j["makespan_s"] = double(r.makespan_ns) * 1e-9;
  j["world_size"] = world;
  j["hbm_bytes"] = cluster.gpu.hbm_bytes;
  if (r.oom.oom) {
    const int st = r.oom.rank >= 0 ? r.oom.rank / std::max(1, plan.devices_per_stage()) : -1;
    j["oom"] = {{"rank", r.oom.rank},           {"stage", st},
                {"op_index", r.oom.op},         {"op", r.oom.op_name},
                {"iteration", r.oom.iteration}, {"time_s", double(r.oom.time_ns) * 1e-9},
                {"bytes", r.oom.bytes},         {"hbm_bytes", r.oom.hbm_bytes}};
  } else {
    j["oom"] = false;
  }
  return j;
}

namespace {

std::vector<trace::OpRecord> records_of(const Program& program, int stage,
                                        std::vector<SimOpSpan> spans) {
  std::sort(spans.begin(), spans.end(), [&](const SimOpSpan& a, const SimOpSpan& b) {
    if (a.start_ns != b.start_ns) return a.start_ns < b.start_ns;
    if (a.iteration != b.iteration) return a.iteration < b.iteration;
    return a.op < b.op;
  });
  std::vector<trace::OpRecord> out;
  out.reserve(spans.size());
  const auto& ops = program.stages[stage].ops;
  for (const auto& s : spans)
    out.push_back(trace::make_record(ops[s.op], int(s.iteration), s.start_ns, s.end_ns));
  return out;
}

}  // namespace

void write_trace(const std::string& path, const SimResult& r, const ModelSpec& model,
                 const ClusterSpec& cluster, const Plan& plan, const Program& program,
                 MPI_Comm comm, const FrameworkSpec& framework) {
  int P = 1, me = 0;
  if (comm != MPI_COMM_NULL) {
    MPI_Comm_size(comm, &P);
    MPI_Comm_rank(comm, &me);
  }
  const int D = std::max(1, plan.devices_per_stage());
  // Who holds which rank.
  const int world = plan.world_size();
  std::vector<int> owner(world, 0);
  if (P > 1) {
    std::vector<int> mine(world, -1), all(world, -1);
    for (int x : r.trace_ranks) mine[x] = me;
    MPI_Allreduce(mine.data(), all.data(), world, MPI_INT, MPI_MAX, comm);
    owner = all;
  }
  if (me != 0) {
    for (size_t i = 0; i < r.trace_ranks.size(); ++i) {
      const auto& sp = r.trace_ops[i];
      const auto& ms = r.trace_memory[i];
      int64_t n[2] = {int64_t(sp.size()), int64_t(ms.size())};
      MPI_Send(n, 2, MPI_INT64_T, 0, 1, comm);
      MPI_Send(sp.data(), int(sp.size() * sizeof(SimOpSpan)), MPI_BYTE, 0, 2, comm);
      MPI_Send(ms.data(), int(ms.size() * sizeof(trace::MemorySample)), MPI_BYTE, 0, 3, comm);
    }
    int ok = 0;
    MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
    if (!ok) throw std::runtime_error("trace: process 0 could not write " + path);
    return;
  }
  // Process 0 receives every rank even after a write error, so that no sender is left blocked.
  std::unique_ptr<trace::Writer> w;
  std::string error;
  auto guarded = [&](auto&& fn) {
    if (!error.empty()) return;
    try {
      fn();
    } catch (const std::exception& e) {
      error = e.what();
      w.reset();
    }
  };
  guarded([&] {
    w = std::make_unique<trace::Writer>(path);
    w->set_attribute("model", to_json(model).dump());
    w->set_attribute("cluster", to_json(cluster).dump());
    w->set_attribute("plan", to_json(plan).dump());
    w->set_attribute("framework", to_json(framework).dump());
    w->set_attribute("tool_version", std::string(kVersion));
    w->set_attribute("source", std::string("simulated"));
    w->set_attribute("clock", std::string("virtual ns from the start of the first iteration"));
    w->set_attribute("iterations", int64_t(r.iterations));
    w->set_attribute("world_size", int64_t(world));
    w->set_attribute("makespan_ns", r.makespan_ns);
  });
  std::vector<int> local_index(world, -1);
  for (size_t i = 0; i < r.trace_ranks.size(); ++i) local_index[r.trace_ranks[i]] = int(i);
  // A symmetric run: a represented rank's trace is its representative's, which has a lower
  // rank and so is received first (representatives are kept until the end).
  const bool lifted = !r.trace_rep_of.empty();
  std::map<int, std::pair<std::vector<SimOpSpan>, std::vector<trace::MemorySample>>> reps;
  for (int rank = 0; rank < world; ++rank) {
    std::vector<SimOpSpan> spans;
    std::vector<trace::MemorySample> mem;
    if (lifted && r.trace_rep_of[rank] != rank) {
      const auto it = reps.find(r.trace_rep_of[rank]);
      if (it == reps.end()) continue;
      spans = it->second.first;
      mem = it->second.second;
    } else if (owner[rank] < 0) {
      continue;
    } else if (owner[rank] == 0) {
      const int i = local_index[rank];
      if (i < 0) continue;
      spans = r.trace_ops[i];
      mem = r.trace_memory[i];
    } else {
      int64_t n[2];
      MPI_Recv(n, 2, MPI_INT64_T, owner[rank], 1, comm, MPI_STATUS_IGNORE);
      spans.resize(n[0]);
      mem.resize(n[1]);
      MPI_Recv(spans.data(), int(n[0] * sizeof(SimOpSpan)), MPI_BYTE, owner[rank], 2, comm,
               MPI_STATUS_IGNORE);
      MPI_Recv(mem.data(), int(n[1] * sizeof(trace::MemorySample)), MPI_BYTE, owner[rank], 3, comm,
               MPI_STATUS_IGNORE);
    }
    if (lifted && r.trace_rep_of[rank] == rank) reps[rank] = {spans, mem};
    guarded([&] {
      w->add_rank_ops(rank, records_of(program, rank / D, std::move(spans)));
      w->add_memory_samples(rank, mem);
    });
  }
  guarded([&] { w->close(); });
  int ok = error.empty() ? 1 : 0;
  if (P > 1) MPI_Bcast(&ok, 1, MPI_INT, 0, comm);
  if (!ok) throw std::runtime_error(error);
}

}  // namespace stratagem
