// The runtime executor: runs this rank's stage Program (the instruction stream the simulator
// runs) op by op, with real kernels and communicators.
//  - Order: ops run in Program order; collectives and transfers are issued without blocking
//    and waited for by the ops that depend on them (the Program's cross-stream deps), so
//    communication overlaps compute the way the simulator assumes.
//  - Memory: alloc and free ops create and release the Program's buffers; the tensors of a
//    block live inside them. What does not fit, and the executor's transient scratch, is
//    counted beside them, so the measured memory is the Program's accounting made real.
//  - Groups and peers come from the Layout through ParallelState.
// Supported: tensor parallelism (with sequence parallelism), pipeline parallelism under GPipe,
// 1F1B and interleaved 1F1B, data parallelism with ZeRO 0-3, recompute and activation offload,
// all chosen layer by layer: each layer has its own (tp, dp) (activations and gradients are
// resharded between layers, and to and from the embedding and LM head, by the Program's
// reshard collectives), its own tensor-parallel share and its own ZeRO partition over its dp
// group; its weights and its optimizer state (with AdamW) on the device or in the host pool;
// sequence parallelism per layer too (its token shards are resharded as a tp 1 layer's stream).
#pragma once
#include <mpi.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stratagem/backend.hpp"
#include "stratagem/data.hpp"
#include "stratagem/framework.hpp"
#include "stratagem/parallel_state.hpp"
#include "stratagem/program.hpp"
#include "stratagem/transformer.hpp"

namespace stratagem {

// The training software the runtime is (data/frameworks/stratagem.json): the Program it runs
// is built with that file's settings, as the estimator and simulator build theirs with
// --framework.
inline constexpr const char* kRuntimeFramework = "stratagem";

struct ExecutorOptions {
  uint64_t seed = 1234;
  float grad_clip = 1.0f;
  LrSchedule schedule;
  AdamWConfig adamw;
  bool update = true;  // false: compute gradients only (reference tests inspect them)
  std::string framework = kRuntimeFramework;  // a name in data/frameworks or a file
};

// Where micro-batches come from: global sample `index` of optimizer step `step`.
class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual void sample(int64_t step, int64_t index, int seq_len, int32_t* tokens,
                      int32_t* targets) const = 0;
};
// Samples drawn from a token file, a pure function of (seed, step, index).
class DatasetSamples final : public SampleSource {
 public:
  DatasetSamples(const TokenDataset& data, uint64_t seed) : data_(data), seed_(seed) {}
  void sample(int64_t step, int64_t index, int seq_len, int32_t* tokens,
              int32_t* targets) const override {
    data_.sample(seed_, step, index, seq_len, tokens, targets);
  }

 private:
  const TokenDataset& data_;
  uint64_t seed_;
};

// What one executed op took: the raw material of the measured trace.
struct OpTiming {
  uint32_t op_index = 0;
  int64_t start_ns = 0, end_ns = 0;  // from the start of the step
  // The bytes the runtime moved for the op, where it counts them (a context-parallel
  // transfer); -1: the Program's count stands.
  int64_t moved_bytes = -1;
};
struct MemorySample {
  int64_t time_ns = 0;
  std::array<int64_t, kNumMemCategories> bytes_in_use{};
};

// A run of the flat parameter buffer, [flat_begin, flat_end), that a rank holds at `local` in
// one of its state tensors (weights, or the optimizer's moments). dp_replicated: every
// data-parallel replica of its layer holds the same values (replica 0, dp_first, writes them
// to a checkpoint); otherwise it is this rank's ZeRO piece of its layer.
struct FlatRun {
  int64_t flat_begin = 0, flat_end = 0, local = 0;
  bool dp_replicated = true;
  bool dp_first = true;
  bool on_host = false;  // weights offloaded by their layer: in host_params(), not model().params
};

struct StepResult {
  int64_t step = 0;
  float loss = 0;       // mean over the global batch (on every rank)
  float grad_norm = 0;  // before clipping (on every rank)
  float lr = 0;
  double time_s = 0;
  std::vector<OpTiming> timings;
  std::vector<MemorySample> memory;
  int64_t high_water_bytes = 0;       // device pool
  int64_t host_high_water_bytes = 0;  // host pool (offloaded states and activations)
};

class Executor {
 public:
  // Throws NotSupported for plans the runtime cannot run yet, InputError for a model that
  // does not fit the plan (heads not divisible by tp, ...).
  Executor(ParallelState& state, const ModelSpec& model, const Plan& plan, Backend& backend,
           const SampleSource& samples, ExecutorOptions options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  StepResult step(int64_t step);  // one optimizer step at 0-based `step`

  // This rank's model part (a stage's layers, one tensor-parallel share) and its state.
  Model& model();
  AdamW& optimizer();
  // Where the flat parameters sit in model().params, or host_params() for layers whose weights
  // are offloaded (ZeRO-3 layers: only this rank's piece), and in optimizer().m()/v()
  // (ZeRO-1/2/3 layers: only this rank's piece).
  const std::vector<FlatRun>& param_runs() const;
  Tensor& host_params();
  const std::vector<FlatRun>& optimizer_runs() const;
  // The optimizer of the layers that offload theirs (on_host runs), or null. Its step count
  // follows optimizer()'s.
  AdamW* host_optimizer();
  const Program& program() const;
  const StageProgram& stage_program() const;
  int64_t high_water_bytes() const;       // device pool, over the steps so far
  int64_t host_high_water_bytes() const;  // host pool
  // The most rows this rank's experts took in one dispatch over the balanced mean, over the
  // steps so far (1 without expert parallelism): the load Plan::expert_load_factor forecasts.
  double moe_busiest_load() const;
  // The MoE layers' transients (the dispatched rows, the experts' gradients): the workspace
  // the forecast sized for them, the most they used at once, and the most held beside it
  // when they did not fit (a forecast that is short). All 0 without MoE layers.
  struct MoeScratchUse {
    int64_t capacity_bytes = 0, peak_bytes = 0, overflow_bytes = 0;
  };
  MoeScratchUse moe_scratch_use() const;
  // The weights were written from outside a step (a checkpoint load): an offloaded optimizer
  // refreshes its host master copy before its next update.
  void weights_loaded();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Throws NotSupported (naming the feature) for a plan the runtime cannot run yet on this
// backend, before any work: sequence parallelism beside per-layer tp, a last layer whose
// (tp, dp) differs from the embedding's, a dtype the backend does not compute in; and
// InputError for a tp that does not divide the heads (or consecutive layers' tp that do not
// divide one another), or offloading beyond the node's host memory (cluster
// node.host_memory_bytes, shared by the node's ranks), with the Program built for
// `framework` (ExecutorOptions::framework); NotSupported for a framework whose Program the
// executor cannot run (one without layer_gradient_staging under ZeRO-2/3).
void check_runnable(const ModelSpec& model, const Plan& plan, const ClusterSpec& cluster,
                    const std::string& backend, const std::string& framework = kRuntimeFramework);

// Writes the measured trace of one step (the runtime side of the trace schema, source =
// "measured"). Collective over `comm`: every rank sends its op timings and memory samples to
// rank 0, which writes the file atomically. Each rank's ops are named from its stage's program.
void write_measured_trace(MPI_Comm comm, const std::string& path, const ModelSpec& model,
                          const ClusterSpec& cluster, const Plan& plan, const Program& program,
                          int stage, const StepResult& step);

}  // namespace stratagem
