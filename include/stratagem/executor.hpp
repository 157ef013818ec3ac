// The runtime executor: runs a rank's Program (the same instruction stream the simulator runs)
// with real kernels and a communicator. The CPU backend covers plans with pp = 1 and tp = 1:
// any dp, ZeRO 0 and 1, gradient accumulation, and recompute none/selective/full. Other plans
// are rejected with NotSupported until the hybrid-parallel runtime lands.
#pragma once
#include <mpi.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stratagem/backend.hpp"
#include "stratagem/comm.hpp"
#include "stratagem/data.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/program.hpp"
#include "stratagem/transformer.hpp"

namespace stratagem {

struct ExecutorOptions {
  uint64_t seed = 1234;
  float grad_clip = 1.0f;
  LrSchedule schedule;
  AdamWConfig adamw;
};

// What one executed op took: the raw material of the measured trace.
struct OpTiming {
  uint32_t op_index = 0;
  int64_t start_ns = 0, end_ns = 0;  // from the start of the step
};
struct MemorySample {
  int64_t time_ns = 0;
  std::array<int64_t, kNumMemCategories> bytes_in_use{};
};

struct StepResult {
  int64_t step = 0;
  float loss = 0;       // mean over the global batch
  float grad_norm = 0;  // before clipping
  float lr = 0;
  double time_s = 0;
  std::vector<OpTiming> timings;
  std::vector<MemorySample> memory;
  int64_t high_water_bytes = 0;
};

class Executor {
 public:
  Executor(MPI_Comm world, const ModelSpec& model, const ClusterSpec& cluster, const Plan& plan,
           Backend& backend, const TokenDataset& data, ExecutorOptions options);
  ~Executor();

  StepResult step(int64_t step);  // one optimizer step at 0-based `step`

  // State for checkpoints: flat fp32 buffers and the tensors inside them.
  const ParamTable& table() const { return model_.table; }
  Model& model() { return model_; }
  AdamW& optimizer() { return *opt_; }
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_end() const { return shard_end_; }
  const Layout& layout() const { return layout_; }
  const StageProgram& program() const { return program_.stages.at(0); }
  int64_t high_water_bytes() const { return high_water_; }

 private:
  struct MicroState;
  void run_op(const Op& op, int64_t step, MicroState*& ms, StepResult& out);
  MicroState& micro(int mb);
  Tensor& alloc_tracked(Tensor& slot, Shape shape, MemCategory cat);
  void track(const std::vector<Tensor*>& tensors, MemCategory cat);  // count in the ledger
  void release(Tensor& t);
  void sample_memory(int64_t now_ns, StepResult& out);
  std::vector<std::pair<int64_t, int64_t>> layer_ranges(int layer) const;
  std::vector<int64_t> shard_counts(int64_t begin, int64_t end) const;
  void dp_reduce(const Op& op);
  void dp_gather(const Op& op);
  void optimizer_step(int64_t step, StepResult& out);

  MPI_Comm world_;
  const ModelSpec& spec_;
  const Plan& plan_;
  Backend& be_;
  const TokenDataset& data_;
  ExecutorOptions opt_cfg_;
  Layout layout_;
  Program program_;
  TransformerConfig cfg_;
  Model model_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<MpiGroups> groups_;
  std::unique_ptr<Communicator> dp_comm_;
  int dp_ = 1, dp_index_ = 0, samples_ = 1, zero_ = 0;
  int64_t shard_begin_ = 0, shard_end_ = 0;
  std::vector<int64_t> shard_bounds_;  // dp+1 boundaries of the ZeRO-1 partition
  std::map<int, std::unique_ptr<MicroState>> micro_;
  AttentionActs scratch_attn_;
  MlpActs scratch_mlp_;
  Tensor scratch_mid_, scratch_out_;
  Workspace ws_;
  std::map<const float*, std::pair<MemCategory, int64_t>> ledger_;
  std::array<int64_t, kNumMemCategories> in_use_{};
  int64_t high_water_ = 0;
  double loss_sum_ = 0;
};

}  // namespace stratagem

namespace stratagem {
// Writes the measured trace of one step (the runtime side of the trace schema, source =
// "measured"). Collective over `comm`: every rank sends its op timings and memory samples to
// rank 0, which writes the file atomically.
void write_measured_trace(MPI_Comm comm, const std::string& path, const ModelSpec& model,
                          const ClusterSpec& cluster, const Plan& plan, const StageProgram& program,
                          const StepResult& step);
}  // namespace stratagem
