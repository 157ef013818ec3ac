// The production executor on one MPI rank over a fixed batch: what the model-level tests and
// the PyTorch reference run (there is no second, serial driver). Link with MPI and call
// MpiSession once per test program.
#pragma once
#include <mpi.h>

#include <memory>
#include <vector>

#include "stratagem/executor.hpp"
#include "stratagem/loaders.hpp"

namespace stratagem::test {

// MPI for a whole test program (a singleton world of one rank).
struct MpiSession {
  MpiSession() {
    int on = 0;
    MPI_Initialized(&on);
    if (!on) MPI_Init(nullptr, nullptr);
  }
  ~MpiSession() {
    int done = 0;
    MPI_Finalized(&done);
    if (!done) MPI_Finalize();
  }
};

// Sample i of every step is row i of (batch, seq) token and target arrays.
class FixedSamples final : public SampleSource {
 public:
  FixedSamples(std::vector<int32_t> tokens, std::vector<int32_t> targets)
      : tokens_(std::move(tokens)), targets_(std::move(targets)) {}
  void sample(int64_t, int64_t index, int seq, int32_t* tok, int32_t* tgt) const override {
    std::copy_n(tokens_.begin() + index * seq, seq, tok);
    std::copy_n(targets_.begin() + index * seq, seq, tgt);
  }

 private:
  std::vector<int32_t> tokens_, targets_;
};

// A 1-rank plan (tp 1, pp 1, dp 1, fp32) of `batch` samples in micro-batches of `micro`.
inline Plan serial_plan(const ModelSpec& m, int batch, int micro, Recompute rc) {
  PlanShorthand s;
  s.tp = 1, s.pp = 1, s.dp = 1, s.micro_batch = micro, s.global_batch = batch;
  s.recompute = rc == Recompute::none ? "none" : rc == Recompute::selective ? "selective" : "full";
  s.dtype = "fp32";
  ClusterSpec c = load_cluster("cpu-local");
  c.nodes = 1, c.node.gpus_per_node = 1;
  return expand_shorthand(s, m, c);
}

struct SerialExecutor {
  ClusterSpec cluster;
  Plan plan;
  FixedSamples samples;
  std::unique_ptr<ParallelState> state;
  std::unique_ptr<Executor> ex;
  SerialExecutor(const ModelSpec& m, Backend& be, int batch, int micro, Recompute rc,
                 FixedSamples data, ExecutorOptions o)
      : cluster(load_cluster("cpu-local")),
        plan(serial_plan(m, batch, micro, rc)),
        samples(std::move(data)) {
    cluster.nodes = 1, cluster.node.gpus_per_node = 1;
    state = std::make_unique<ParallelState>(MPI_COMM_WORLD, plan, cluster, 0);
    ex = std::make_unique<Executor>(*state, m, plan, be, samples, o);
  }
  Model& model() { return ex->model(); }
};

}  // namespace stratagem::test
