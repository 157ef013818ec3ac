// Offloading on this rank (exec/ops_offload.cpp): the Program's copy_h2d, copy_d2h and
// host_compute ops (weights, activations, the host optimizer) on the copy streams.
#pragma once
#include "src/runtime/exec/copy_stream.hpp"
#include "src/runtime/exec/handlers.hpp"
#include "stratagem/program.hpp"

namespace stratagem::exec {

class OffloadOps {
 public:
  OffloadOps(RankContext& rank, ComputeOps& compute) : rank_(rank), compute_(compute) {}

  void copy(const Op& op, int index);  // copy_h2d / copy_d2h on their streams
  void host_compute(const Op& op, int index);
  // Binds the fetch set of `op` inside its fetch buffer and copies in this rank's part (its
  // ZeRO-3 piece, or the whole tensors): now, or on the h2d stream when `stream` is given.
  void place_fetch(const Op& op, CopyStream* stream, int index);

 private:
  void offload_activations(const Op& op, int index);
  void reload_activations(const Op& op, int index);

  RankContext& rank_;
  ComputeOps& compute_;
};

}  // namespace stratagem::exec
