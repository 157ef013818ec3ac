// The Program's collectives, sends and receives on this rank (exec/ops_comm.cpp): the tensor-
// and data-parallel collectives, ZeRO-3's weight gathers and the pipeline's sends and
// receives; those of context parallelism and of MoE layers go to their handlers. With the
// reshard all-gathers (exec/reshard.cpp), the slices that take their place where no transfer is
// needed: what the stream between layers of different dp needs, whichever way it goes.
#pragma once
#include <cstdint>

#include "src/runtime/exec/handlers.hpp"
#include "src/runtime/exec/step_state.hpp"
#include "stratagem/program.hpp"

namespace stratagem::exec {

class CommOps {
 public:
  CommOps(RankContext& rank, Dispatcher& dispatcher, ComputeOps& compute, CpOps& cp, MoeOps& moe,
          OffloadOps& offload)
      : rank_(rank),
        dispatcher_(dispatcher),
        compute_(compute),
        cp_(cp),
        moe_(moe),
        offload_(offload) {}

  void collective(const Op& op, int index);
  void send(const Op& op, int index);
  void recv(const Op& op, int index);
  // This rank's slice of the samples, of the stream entering `layer` in forward or of the
  // gradient leaving it in backward, where the layer's dp is larger than its neighbour's.
  void fit_flow(Flow& f, int layer);
  void fit_grad(Micro& m, int layer);

 private:
  void tp_collective(const Op& op, int index);
  // The gradients of weights replicated over tp that each rank computed from its own tokens:
  // the norms' under sequence parallelism, an MoE layer's router's (Block::router).
  void tp_norm_grads_sum(const Op& op, int index);
  void tp_gather(const Op& op, int index);
  void tp_reduce(const Op& op, int index);  // a partial sum's all-reduce or reduce-scatter
  void dp_collective(const Op& op, int index);
  void fetch(const Op& op, int index);  // ZeRO-3: gather a layer's (or embedding's) weights
  // A reduce-scatter's received piece of n floats, in the Program's buffer the op names.
  Tensor received_piece(const Op& op, int index, int64_t n);
  int pp_tag(const Op& op, bool sending) const;
  void reshard(const Op& op, int index);  // the Program's reshard all-gathers

  RankContext& rank_;
  Dispatcher& dispatcher_;
  ComputeOps& compute_;
  CpOps& cp_;
  MoeOps& moe_;
  OffloadOps& offload_;
};

}  // namespace stratagem::exec
