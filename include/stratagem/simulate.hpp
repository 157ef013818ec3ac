// The discrete-event simulator: runs every rank's Program in virtual time (integer
// nanoseconds) with per-rank streams, collectives that start when their last member arrives,
// eager sends, bandwidth sharing on NVSwitch ports, PCIe links and node NICs, compute slowed
// while communication overlaps it, and each rank's memory timeline. Under MPI the simulated
// ranks are spread over the processes (conservative, window-synchronous PDES); the result is
// bit-identical for any process count. Design and trace schema: sim/README.md.
#pragma once
#include <mpi.h>

#include <array>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "stratagem/cost.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/program.hpp"
#include "stratagem/trace.hpp"

namespace stratagem {

// Where the simulator takes each op's cost from. The cost model is the real one
// (CostModelCosts); tests inject known times. The simulator calls these once per distinct op
// while it sets up, never per event. comm_cost is called for collectives, sends and copies with
// one representative rank per "rank class" of a stage (ranks whose groups span the same number
// of ranks and nodes and whose pipeline peers are on the same/other node alike), so it must
// depend on the rank only through that geometry, as CostModel::comm_cost does.
class OpCosts {
 public:
  virtual ~OpCosts() = default;
  virtual double compute_time_s(const Op& op) const = 0;  // compute and host_compute ops
  virtual CommCost comm_cost(const Op& op, const Layout& layout, int rank) const = 0;
  // Host time to issue a compute op before the GPU can run it (0: the host keeps ahead).
  virtual double host_issue_time_s(const Op& op) const {
    (void)op;
    return 0;
  }
  // Device memory of a stage's ranks that the Program does not allocate (the cost model's
  // gradient workspace, counted as buffers), bytes.
  virtual int64_t workspace_bytes(int stage) const {
    (void)stage;
    return 0;
  }
  // The GPU process ledger of a stage's ranks (CUDA context, NCCL, cuBLAS workspaces: the cost
  // model's process_memory); none by default.
  virtual ProcessMemory process_memory(int stage) const {
    (void)stage;
    return {};
  }
};

// The cost model as OpCosts (sim/cost_model_costs.cpp); the plan gives each stage's workspace
// and GPU process ledger, which the Program does not allocate.
class CostModelCosts final : public OpCosts {
 public:
  CostModelCosts(const CostModel& cost, const Plan& plan);
  double compute_time_s(const Op& op) const override;
  CommCost comm_cost(const Op& op, const Layout& layout, int rank) const override;
  double host_issue_time_s(const Op& op) const override;
  int64_t workspace_bytes(int stage) const override;
  ProcessMemory process_memory(int stage) const override;

 private:
  const CostModel& cost_;
  std::vector<int64_t> workspace_;
  std::vector<ProcessMemory> process_;
};

struct SimOptions {
  int iterations = 1;
  // Compute slowdown while a comm op of the same rank moves data; <= 0 takes
  // the cluster file's gpu.compute_comm_interference; 1 disables it.
  double interference = 0;
  bool record_trace = false;
  // MPI: spread the simulated ranks over this communicator (MPI_COMM_NULL: this process
  // simulates everything). Every process of `comm` must call simulate() with the same inputs.
  MPI_Comm comm = MPI_COMM_NULL;
  // Each process simulates the rank equal to its own rank in `comm` (its size must equal the
  // plan's world size): the job's real rank layout.
  bool mirror = false;
  // Simulate every rank even where ranks are symmetric (by default one representative per
  // class of identically behaving ranks runs; see sim/symmetry.hpp). Mirror runs always
  // simulate every rank.
  bool full = false;
};

struct SimRankResult {
  int32_t rank = 0;
  int32_t stage = 0;
  // At the rank's peak, by the cost model's device_memory: the device's bytes (allocations +
  // workspace + the GPU process ledger), what the caching allocator reserved and what it handed
  // out (allocations + workspace + cuBLAS workspace); and their parts.
  int64_t peak_memory_bytes = 0;
  int64_t peak_reserved_bytes = 0;
  int64_t peak_allocated_bytes = 0;
  std::array<int64_t, kNumMemCategories>
      peak_by_category{};  // at the peak; buffers incl. workspace
  int64_t peak_cublas_workspace_bytes = 0;
  int64_t peak_fragmentation_bytes = 0;
  int64_t peak_cuda_context_bytes = 0;
  int64_t peak_nccl_buffers_bytes = 0;
  int64_t peak_time_ns = 0;
  int32_t peak_op = -1;  // op index in the stage program (-1: before any allocation)
  int32_t peak_iteration = 0;
  int64_t end_ns = 0;  // last op of the rank finished
  // Time accounting of the rank's compute stream over all iterations (ns); the eight parts sum
  // to the makespan: busy kernels (compute, recompute, optimizer) and the idle gaps, each gap
  // charged to what the next kernel waited for.
  int64_t compute_ns = 0, recompute_ns = 0, optimizer_ns = 0;
  int64_t tp_ns = 0, dp_ns = 0, pp_ns = 0, bubble_ns = 0, offload_ns = 0;
  int64_t ep_ns = 0;    // exposed MoE all-to-alls (stream ep_comm)
  int64_t cp_ns = 0;    // context parallelism's exposed transfers and collectives
  int64_t host_ns = 0;  // compute stream idle while the framework's host issued its next op
  int64_t ops_executed = 0;
};

struct SimOom {
  bool oom = false;
  int32_t rank = -1;
  int32_t op = -1;  // op index in the rank's stage program
  int32_t iteration = 0;
  int64_t time_ns = 0;
  int64_t bytes = 0;  // device bytes after the allocation
  int64_t hbm_bytes = 0;
  std::string op_name;
};

struct SimDeadlock {
  bool deadlocked = false;
  int64_t time_ns = 0;     // virtual time when nothing could run any more
  std::vector<int> ranks;  // stuck ranks
  std::string message;     // names the stuck ranks and their pending ops
};

struct SimStats {
  uint64_t ops_executed = 0;  // op executions of all ranks (the same for any process count)
  uint64_t heap_events = 0;   // events popped from the event queues, all processes
  uint64_t windows = 0;       // PDES synchronization windows (0 for one process)
  uint64_t messages = 0;      // cross-process events exchanged
  int processes = 1;
  bool symmetric = false;         // one representative per class of symmetric ranks ran
  int simulated_ranks = 0;        // ranks actually simulated (all of them unless symmetric)
  uint64_t ops_simulated = 0;     // op executions of the simulated ranks
  double setup_s = 0, run_s = 0;  // wall time on process 0
};

// One op execution of a traced rank.
struct SimOpSpan {
  uint32_t op = 0;
  uint32_t iteration = 0;
  int64_t start_ns = 0, end_ns = 0;
};

struct SimResult {
  int64_t makespan_ns = 0;  // all iterations
  int iterations = 1;
  std::vector<SimRankResult> ranks;  // every rank (on process 0 of the communicator)
  SimOom oom;                        // the first allocation over gpu.hbm_bytes, if any
  SimDeadlock deadlock;
  SimStats stats;
  bool host_issue = false;  // the framework's host paced the ops (OpCosts::host_issue_time_s)
  // record_trace: the ranks this process simulated, their op spans and memory samples; in a
  // symmetric run, trace_rep_of[r] is the simulated rank whose trace rank r shares (empty: every
  // rank was simulated).
  std::vector<int> trace_rep_of;
  std::vector<int> trace_ranks;
  std::vector<std::vector<SimOpSpan>> trace_ops;
  std::vector<std::vector<trace::MemorySample>> trace_memory;
};

// Simulates `options.iterations` iterations of `program` on every rank of `layout`.
// Collective over options.comm. A deadlocked Program is reported in result.deadlock (never
// hangs); an allocation beyond the GPU's memory in result.oom (the run continues).
SimResult simulate(const Program& program, const Layout& layout, const ClusterSpec& cluster,
                   const OpCosts& costs, const SimOptions& options = {});
// The same figures as simulate(), for callers that need only them (the search's re-rank): the
// simulator frees each stage's ops of `program` once it has indexed them, so that it holds
// about the larger of the Program and its own index rather than both (GPT-3 175B, pp 16, 1536
// micro-batches: 220 instead of 350 MB). `program` is left without ops. On one process only
// (options.comm with more processes, options.record_trace or options.mirror: as simulate()).
// An out-of-memory op is named by its index, and a deadlock report lists the stuck ranks'
// positions without op names (simulate() the Program again for those).
SimResult simulate_consuming(Program&& program, const Layout& layout, const ClusterSpec& cluster,
                             const OpCosts& costs, const SimOptions& options = {});

// Memory the simulator needs in each process, estimated before anything is allocated: every
// process holds every simulated rank's state, groups and result, plus each of its ranks'
// op spans when a trace is recorded.
int64_t simulation_footprint_bytes(const Program& program, int world_size,
                                   const SimOptions& options);
// What this process may allocate: the smallest of physical memory, RLIMIT_AS/RLIMIT_DATA and
// the cgroup's memory.max; `limited_by` names which.
int64_t memory_limit_bytes(std::string* limited_by);

// A rank's memory at its peak, in the estimator's parts.
MemoryBreakdown peak_breakdown(const SimRankResult& x);
// The run's figures with the keys of `stratagem estimate --json` (iteration_time_s,
// tokens_per_s, tflops_per_gpu, mfu, peak_memory_bytes, peak_reserved_bytes,
// peak_allocated_bytes, memory_breakdown_bytes, time_breakdown_s) plus bubble_fraction,
// exposed_comm_s, per_rank, events_processed, oom.
nlohmann::json to_json(const SimResult& r, const ModelSpec& model, const ClusterSpec& cluster,
                       const Plan& plan, const Program& program);

// Writes an HDF5 trace of a run with record_trace (source = "simulated"). Collective over
// `comm` (MPI_COMM_NULL: this process holds every rank); process 0 writes.
void write_trace(const std::string& path, const SimResult& r, const ModelSpec& model,
                 const ClusterSpec& cluster, const Plan& plan, const Program& program,
                 MPI_Comm comm, const FrameworkSpec& framework = FrameworkSpec{});

}  // namespace stratagem
