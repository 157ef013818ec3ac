// Inside the executor (executor.hpp): one rank running its stage Program. Impl puts together
// what the rank keeps and the handlers that run its ops, one per op family:
//   rank       (exec/rank_context.hpp) what the rank runs and keeps (the plan, the Program, each
//              layer's share, buffers, shards, offload, requests, streams, the current step);
//              the handlers keep nothing of their own and all reference it
//   dispatcher (exec/dispatch.hpp)  the op loop: each op on its handler, after its dependencies;
//              transfers' completions; memory samples
//   run_ahead  (exec/run_ahead.hpp) the prefetching streams (h2d, dp) ahead of the op loop
//   compute    (exec/ops_compute.hpp) the embedding, blocks, head, loss and optimizer step
//   comm       (exec/ops_comm.hpp)  tp and dp collectives, ZeRO-3 fetches, pipeline transfers,
//              the stream between layers whose data-parallel degree differs (exec/reshard.cpp)
//   cp         (exec/ops_cp.hpp)    a context-parallel attention's core steps and transfers
//   moe        (exec/ops_moe.hpp)   an MoE layer's router, experts, combine and all-to-alls
//   offload    (exec/ops_offload.hpp) copies to and from the host, the host optimizer
// A handler reaches another through a reference to it, for what crosses families: the comm
// handler completes a block's backward on the compute handler, every handler waits for a
// transfer on the dispatcher.
#pragma once
#include <utility>

#include "src/runtime/exec/dispatch.hpp"
#include "src/runtime/exec/ops_comm.hpp"
#include "src/runtime/exec/ops_compute.hpp"
#include "src/runtime/exec/ops_cp.hpp"
#include "src/runtime/exec/ops_moe.hpp"
#include "src/runtime/exec/ops_offload.hpp"
#include "src/runtime/exec/rank_context.hpp"
#include "src/runtime/exec/run_ahead.hpp"
#include "stratagem/executor.hpp"

namespace stratagem {

struct Executor::Impl {
  Impl(ParallelState& state, const ModelSpec& model, const Plan& plan, Backend& backend,
       const SampleSource& samples, ExecutorOptions options)
      : rank(state, model, plan, backend, samples, std::move(options)) {}

  // First, so that it goes last: the handlers only reference it.
  exec::RankContext rank;
  // (A handler's references may name handlers declared after it: none is used before the
  // first step.)
  exec::Dispatcher dispatcher{rank, run_ahead, compute, comm, offload};
  exec::RunAhead run_ahead{rank, dispatcher};
  exec::ComputeOps compute{rank, dispatcher, cp, moe, comm};
  exec::CommOps comm{rank, dispatcher, compute, cp, moe, offload};
  exec::CpOps cp{rank, dispatcher};
  exec::MoeOps moe{rank, compute, comm};
  exec::OffloadOps offload{rank, compute};
};

}  // namespace stratagem
