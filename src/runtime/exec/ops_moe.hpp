// An MoE layer's FFN on this rank (exec/ops_moe.cpp): its router, experts and combine compute
// ops, the tp sum of its load-balancing loss, and its all-to-alls and expert-tp collectives.
// Its norm and the norm's backward are the dense blocks' (the compute handler's).
#pragma once
#include "src/runtime/exec/handlers.hpp"
#include "src/runtime/exec/step_state.hpp"
#include "src/runtime/rank_plan.hpp"
#include "stratagem/program.hpp"

namespace stratagem::exec {

class MoeOps {
 public:
  MoeOps(RankContext& rank, ComputeOps& compute, CommOps& comm)
      : rank_(rank), compute_(compute), comm_(comm) {}

  void compute(const Op& op);  // Block::router, experts or combine
  void ep_collective(const Op& op, int index);
  void etp_collective(const Op& op);  // the expert-tp all-gather and reduce-scatter (blocking)
  void aux_sum(const Op& op);         // tp > 1: the load-balancing loss's sums over tp

 private:
  void router(const Op& op, Micro& m, LayerState& ls);
  void experts(const Op& op, LayerState& ls);
  void combine(const Op& op, Micro& m, LayerState& ls);
  void router_back(const Op& op, Micro& m, LayerState& ls);
  void experts_back(const Op& op, LayerState& ls);
  void combine_back(const Op& op, Micro& m, LayerState& ls);
  void add_aux_loss(const LayerShare& sh, const MoeActs& a);

  RankContext& rank_;
  ComputeOps& compute_;
  CommOps& comm_;
};

}  // namespace stratagem::exec
