#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "src/cli/command.hpp"
#include "src/cli/launch.hpp"
#include "src/cli/memory_check.hpp"
#include "src/cli/model_support.hpp"
#include "stratagem/backend.hpp"
#include "stratagem/checkpoint.hpp"
#include "stratagem/cuda_device.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/stop_signal.hpp"
#include "stratagem/trainer.hpp"

namespace stratagem::cli {
namespace {

// cuda when the NVIDIA driver shows a GPU and the CUDA plugin is beside the binary, else cpu
// (asking the driver loads no CUDA library). STRATAGEM_BACKEND overrides it (the CPU backend's
// tests set cpu, so they test it on GPU machines too).
std::string default_backend() {
  if (const char* env = std::getenv("STRATAGEM_BACKEND"); env && *env) return env;
  std::error_code ec;
  if (cuda::driver_device_count() > 0 && std::filesystem::exists(cuda::plugin_path(), ec))
    return "cuda";
  return "cpu";
}

// --backend cuda where it cannot run (no GPU, no plugin, a CUDA library missing): one line,
// exit 2. Loads the plugin when there is a GPU.
void check_cuda_available(const std::string& command) {
  if (const std::string why = cuda::unavailable_reason(); !why.empty())
    throw InputError(command + ": --backend cuda: " + why);
}

// The cluster description of CUDA device 0, by its name (data/gpus.json); cpu-local when
// there is no device (the run is refused later, with its own message).
std::string cluster_for_gpu() {
  if (!cuda::unavailable_reason().empty()) return "cpu-local";
  const std::string name = cuda::device_name(0);
  const std::string path = data_dir() + "/gpus.json";
  const nlohmann::json table = io::read_json_file(path);
  std::string best_key, best;
  for (const auto& [key, cluster] : table.items())
    if (name.find(key) != std::string::npos && key.size() > best_key.size())
      best_key = key, best = cluster.get<std::string>();
  if (best.empty())
    throw InputError("--backend cuda: GPU '" + name + "' is not in " + path +
                     "; pass --cluster with a description of this node (its peak FLOP/s sets MFU)");
  return best;
}

// The training loop's flags (steps, checkpoints, logs, schedule), each refused alone when out
// of range (one line, exit 2).
TrainerOptions trainer_options(Args& a) {
  TrainerOptions o;
  // Count flags take bounds, so a negative or absurd value is one clear line (exit 2).
  o.steps = a.int_value("--steps", 1, 1000000000).value_or(-1);
  o.ckpt_dir = a.value("--ckpt-dir");
  if (o.ckpt_dir) a.owned_folder("--ckpt-dir", *o.ckpt_dir);
  o.ckpt_every = a.int_value("--ckpt-every", 0, 1000000000).value_or(0);
  o.keep = a.int_value("--keep", 1, 1000000).value_or(3);
  o.resume = a.flag("--resume");
  o.overwrite = a.flag("--overwrite");
  o.stop_after = a.int_value("--stop-after", 1, 1000000000).value_or(-1);
  o.trace_path = a.output("--trace");
  o.log_json = a.output("--log-json");
  o.log_every = a.int_value("--log-every", 1, 1000000000).value_or(1);
  o.comm_timeout_s = comm_timeout_s();  // parsed by main for every command
  o.skip_nonfinite = a.int_value("--skip-nonfinite", 0, INT_MAX).value_or(0);
  ExecutorOptions& opt = o.exec;
  opt.seed = static_cast<uint64_t>(a.int_value("--seed", 0, INT_MAX).value_or(1234));
  // Rates are fp32 in the optimizer: a value it cannot hold (--lr 1e39) would fail at step 2.
  const double fp32_max = std::numeric_limits<float>::max();
  const double lr =
      a.double_in("--lr", 0, fp32_max, "a learning rate >= 0 that fp32 holds").value_or(1e-3);
  opt.schedule.max_lr = static_cast<float>(lr);
  opt.schedule.min_lr = static_cast<float>(
      a.double_in("--min-lr", 0, lr, "a learning rate in [0, --lr]").value_or(lr / 10));
  opt.schedule.warmup_steps = a.int_value("--warmup", 0, 1000000000).value_or(0);
  opt.adamw.weight_decay = static_cast<float>(
      a.double_in("--weight-decay", 0, fp32_max, "a weight decay >= 0 that fp32 holds")
          .value_or(0.1));
  opt.grad_clip = static_cast<float>(
      a.double_in("--grad-clip", 0, fp32_max, "a gradient norm bound >= 0 that fp32 holds")
          .value_or(1.0));
  return o;
}

// Rules between the loop's flags.
void check_trainer_options(const TrainerOptions& o, const std::string& cmd) {
  if (o.steps < 1) throw InputError(cmd + ": --steps: expected >= 1");
  if (o.ckpt_every > 0 && !o.ckpt_dir) throw InputError(cmd + ": --ckpt-every needs --ckpt-dir");
  if (o.resume && !o.ckpt_dir) throw InputError(cmd + ": --resume needs --ckpt-dir");
  if (o.overwrite && !o.ckpt_dir) throw InputError(cmd + ": --overwrite needs --ckpt-dir");
  if (o.overwrite && o.resume)
    throw InputError(cmd +
                     ": --overwrite and --resume: give one (continue the run in --ckpt-dir, "
                     "or replace its checkpoints)");
  // A fresh run beside another run's checkpoints would prune them with --keep, and a later
  // --resume would continue the other run without a word.
  if (o.ckpt_dir && !o.resume && !o.overwrite) {
    const std::vector<std::string> found = list_checkpoints(*o.ckpt_dir);
    if (!found.empty())
      throw InputError(cmd + ": --ckpt-dir " + *o.ckpt_dir + " holds " +
                       std::to_string(found.size()) + " checkpoint(s) of another run (newest " +
                       std::filesystem::path(found.back()).filename().string() +
                       "): pass --resume to continue it, or --overwrite to replace them");
  }
}

// What the flags say about the backend and the communicator, checked before any work.
struct BackendChoice {
  std::string backend, comm;
  bool comm_given = false;
};
void check_backend(BackendChoice& b, Plan& plan, bool dtype_given, const TrainerOptions& o,
                   const std::string& cmd) {
  if (b.backend != "cpu" && b.backend != "cuda")
    throw InputError(cmd + ": --backend: expected cpu|cuda, got '" + b.backend + "'");
  if (b.comm != "mpi" && b.comm != "nccl")
    throw InputError(cmd + ": --comm: expected mpi|nccl, got '" + b.comm + "'");
  if (b.backend == "cpu" && b.comm != "mpi")
    throw InputError(cmd + ": --comm nccl needs --backend cuda");
  if (b.backend == "cpu") {
    // The CPU backend computes in fp32: its plan says so, so the forecast it is compared with
    // counts the same bytes.
    if (!dtype_given) plan.dtype = Dtype::fp32;
    return;
  }
  if (plan.dtype != Dtype::fp32 && plan.dtype != Dtype::bf16)
    throw InputError(cmd + ": --dtype " + to_string(plan.dtype) +
                     ": the cuda backend computes in bf16 or fp32");
  check_cuda_available(cmd);
  // Without --comm, NCCL when the plugin has it; --comm nccl without it is refused here,
  // before any rank starts work.
  if (!b.comm_given && !cuda::have_nccl()) b.comm = "mpi";
  if (b.comm == "nccl" && !cuda::have_nccl())
    throw InputError(cmd + ": --comm nccl: the CUDA plugin " + cuda::plugin_path() +
                     " was built without NCCL; use --comm mpi");
  // Checkpoints and the measured memory read host memory today.
  if (o.ckpt_dir)
    throw NotSupported(
        "--ckpt-dir with --backend cuda: checkpoints read the weights from "
        "host memory; device-memory checkpoints are not implemented yet");
}

// --cluster, or the node we run on: on a GPU the one holding this GPU's peak
// (data/gpus.json), so the log's MFU is measured against it.
ClusterSpec train_cluster(Args& a, const std::string& backend) {
  const bool nodes_given = a.value("--nodes").has_value();
  const std::string default_cluster =
      backend == "cuda" && !a.value("--cluster") ? cluster_for_gpu() : "cpu-local";
  ClusterSpec cluster = cluster_from_args(a, default_cluster.c_str());
  if (!nodes_given) {
    // Without --nodes the modeled cluster is the one we were launched on: a partly used node
    // counts as a smaller node.
    const int g = cluster.node.gpus_per_node;
    if (world_size() < g)
      cluster.nodes = 1, cluster.node.gpus_per_node = world_size();
    else if (world_size() % g == 0)
      cluster.nodes = world_size() / g;
  }
  return cluster;
}

// The backend this rank computes on (collective: the ranks of a node share out the GPUs).
std::unique_ptr<Backend> make_train_backend(BackendChoice& b, const Plan& plan, TrainerOptions& o,
                                            bool quiet) {
  if (b.backend == "cpu") return make_cpu_backend();
  const int local = local_rank();
  const int device =
      choose_local_device(local, local_size(), cuda::device_count(), b.comm == "nccl");
  auto backend =
      cuda::make_backend(device, plan.dtype == Dtype::bf16 ? ScalarType::bf16 : ScalarType::fp32);
  o.make_comm = b.comm == "nccl" ? cuda::nccl_comm_factory(*backend)
                                 : cuda::host_staging_comm_factory(*backend);
  if (world_rank() == 0 && !quiet)
    std::printf("train: rank 0 drives CUDA device %d (%s), CUDA runtime %s\n", device,
                cuda::device_name(device).c_str(), cuda::runtime_version().c_str());
  return backend;
}

// The run's figures (--json), and on cuda what the caching allocator held.
void print_result(const TrainSummary& r, const ModelSpec& model, const Plan& plan,
                  const BackendChoice& b, Backend& backend, bool json) {
  int64_t high[2] = {r.high_water_bytes, r.host_high_water_bytes};
  MPI_Allreduce(MPI_IN_PLACE, high, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  // What the device allocator held at most, beside the executor's ledger (which counts the
  // Program's buffers): the difference is cached blocks and rounding.
  int64_t device_reserved = 0;
  if (b.backend == "cuda") device_reserved = cuda::device_memory(backend).reserved_high_water_bytes;
  MPI_Allreduce(MPI_IN_PLACE, &device_reserved, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (b.backend == "cuda" && world_rank() == 0 && !json)
    std::printf(
        "train: peak memory per rank %.2f GiB in the executor's ledger, %.2f GiB reserved "
        "by the CUDA caching allocator\n",
        double(high[0]) / (1 << 30), double(device_reserved) / (1 << 30));
  // Expert parallelism: the load the busiest expert rank really took, and the plan figure
  // that forecasts it (the routing is the model's and the data's, not the plan's).
  double load = r.moe_busiest_load;
  MPI_Allreduce(MPI_IN_PLACE, &load, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  int ep = 1;
  for (size_t l = 0; l < plan.layers.size(); ++l)
    if (model.is_moe_layer(int(l))) ep = std::max(ep, plan.layers[l].ep);
  const double imbalance = Plan::routing_imbalance_for(load, ep, model.moe.experts);
  if (ep > 1 && world_rank() == 0 && !json)
    std::printf(
        "train: MoE routing: the busiest expert rank took %.2fx the balanced mean rows in one "
        "dispatch (the plan forecasts %.2fx; --routing-imbalance %.2f forecasts what this run "
        "saw)\n",
        load, plan.expert_load_factor(ep, model.moe.experts), imbalance);
  nlohmann::json out = {{"steps_completed", r.steps_completed},
                        {"loss", r.last.loss},
                        {"grad_norm", r.last.grad_norm},
                        {"lr", r.last.lr},
                        {"tokens_per_s", double(plan.global_batch) * model.seq_len / r.last.time_s},
                        {"high_water_bytes", high[0]},
                        {"host_high_water_bytes", high[1]},
                        {"device_reserved_high_water_bytes", device_reserved},
                        {"checkpoint", r.checkpoint}};
  // The MoE transients' workspace, the busiest rank's: what it used of what the forecast
  // sized, and what it held beside that when the forecast was short.
  int64_t scratch[3] = {r.moe_scratch.capacity_bytes, r.moe_scratch.peak_bytes,
                        r.moe_scratch.overflow_bytes};
  MPI_Allreduce(MPI_IN_PLACE, scratch, 3, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (scratch[0] > 0 && world_rank() == 0 && !json)
    std::printf(
        "train: MoE scratch: at most %.1f KiB live of the %.1f KiB the forecast sized (%.1f "
        "KiB beside it)\n",
        double(scratch[1]) / 1024, double(scratch[0]) / 1024, double(scratch[2]) / 1024);
  if (ep > 1) out["moe"] = {{"busiest_rank_load", load}, {"routing_imbalance_seen", imbalance}};
  if (scratch[0] > 0)
    out["moe_scratch"] = {
        {"capacity_bytes", scratch[0]}, {"peak_bytes", scratch[1]}, {"overflow_bytes", scratch[2]}};
  if (json) print_json(out);
}

int run_train(Args& a) {
  // Installed first: a signal while the job starts (an `open` of a FIFO given as an input
  // blocks forever) ends it at once; in the loop it asks for a checkpoint.
  const double grace_s =
      a.double_in("--signal-grace-s", 0, 1e6, "seconds in [0, 1e6] (0: no bound)").value_or(120);
  const bool alone = world_size() == 1;
  install_stop_signals(grace_s,
                       alone ? "stratagem train: "
                             : "stratagem train: on rank " + std::to_string(world_rank()) + ": ",
                       /*quiet_before_loop=*/!alone);
  const auto data_path = a.required("--data");
  TrainerOptions o = trainer_options(a);
  BackendChoice b;
  b.backend = a.value("--backend").value_or(default_backend());
  // Without --comm: mpi on the cpu backend; on cuda, nccl when every rank of the node has a
  // GPU of its own, else mpi staged through host memory (decided once the ranks agree below).
  const auto comm_arg = a.value("--comm");
  b.comm_given = comm_arg.has_value();
  b.comm = comm_arg.value_or(b.backend == "cuda" ? "nccl" : "mpi");
  const bool json = a.flag("--json");
  o.quiet = json;
  const bool dtype_given = a.value("--dtype").has_value();
  ModelSpec model = model_from_args(a);
  require_supported_model(model, a.command(), ModelUse::train);
  ClusterSpec cluster = train_cluster(a, b.backend);
  Plan plan = plan_from_args(a, model, cluster);
  a.finish();
  check_trainer_options(o, a.command());
  check_backend(b, plan, dtype_given, o, a.command());
  // The world must match the plan before any work starts.
  if (world_size() != plan.world_size())
    throw InputError(a.command() + ": the plan needs " + std::to_string(plan.world_size()) +
                     " ranks (pp x tp x cp x dp) but MPI started " + std::to_string(world_size()) +
                     "; use mpirun -np " + std::to_string(plan.world_size()));
  check_launch(a.command());
  check_runnable(model, plan, cluster, b.backend);
  if (b.backend == "cpu") check_train_memory(model, cluster, plan, local_size(), a.command());
  // Every backend builds the step's Program on the host.
  check_program_memory(model, plan, local_size(), a.command());
  o.exec.schedule.total_steps = o.steps;

  TokenDataset data = TokenDataset::load(data_path);
  data.check_fits(model.seq_len, model.vocab);
  // From here on ranks work together: an error on one rank must end all of them. Entering is
  // an agreement: a rank whose own input failed above ends the job with its message.
  begin_collective_phase(o.comm_timeout_s);
  const int local = local_rank();  // every rank must take part: it is a collective
  if (b.backend == "cuda" && !b.comm_given && local_size() > cuda::device_count()) b.comm = "mpi";
  if (world_rank() == 0 && !json)
    std::printf(
        "train: %s, %d ranks (%s), backend %s (%s, comm %s), local rank of rank 0: %d, data %s "
        "(%lld tokens)\n",
        model.name.c_str(), world_size(), plan.describe().c_str(), b.backend.c_str(),
        to_string(plan.dtype), b.comm.c_str(), local, data_path.c_str(), (long long)data.size());
  std::unique_ptr<Backend> backend = make_train_backend(b, plan, o, json);
  TrainSummary r = train(MPI_COMM_WORLD, model, cluster, plan, *backend, data, o);
  print_result(r, model, plan, b, *backend, json);
  return 0;
}

Register reg{
    {"train", "run the training loop of a plan with real kernels (CPU or CUDA backend)",
     std::string(
         "usage: mpirun -np N stratagem train --model M --cluster cpu-local "
         "(--plan FILE | shorthand flags) --data FILE --steps S\n"
         "       [--ckpt-dir D --ckpt-every K --keep 3] [--resume | --overwrite] [--stop-after N]\n"
         "       [--trace FILE.h5] [--signal-grace-s 120]\n"
         "       [--seed X] [--log-json FILE] [--log-every N] [--lr 1e-3 --min-lr --warmup N\n"
         "       --weight-decay 0.1 --grad-clip 1.0] [--backend cpu|cuda] [--comm mpi|nccl]\n"
         "       [--json]\n"
         "       [--skip-nonfinite 0]\n"
         "  SIGUSR1/SIGTERM: checkpoint at the next step boundary on all ranks, exit 0. Before\n"
         "  the training loop, a second SIGTERM, or no step boundary within --signal-grace-s:\n"
         "  exit 128+signal at once, without a checkpoint.\n"
         "  A fresh run refuses a --ckpt-dir holding checkpoints (--resume continues that run,\n"
         "  --overwrite removes them). --resume refuses a --seed other than the checkpoint's\n"
         "  and --steps below its step. No output (--trace, --log-json) and no input may be\n"
         "  inside --ckpt-dir.\n"
         "  The cpu backend computes in fp32 (the plan's dtype unless --dtype is given).\n"
         "  --backend defaults to cuda when a GPU is visible, else cpu. The cuda backend keeps\n"
         "  fp32 weights and computes its GEMMs in --dtype (bf16 with fp32 accumulation by\n"
         "  default, or fp32). --comm nccl needs one GPU per rank; --comm mpi stages device\n"
         "  buffers through host memory, so several ranks may share a GPU. The default is nccl\n"
         "  when each rank of a node has a GPU of its own, else mpi. STRATAGEM_BACKEND=cpu|cuda\n"
         "  sets the default backend.\n"
         "  --offload runs on the cpu backend: the optimizer (AdamW on the host), weights and\n"
         "  saved activations live in a host pool (--json: host_high_water_bytes); a plan that\n"
         "  offloads more than the node's host_memory_bytes exits 2. tp/dp, ZeRO stage,\n"
         "  recompute, offload, sequence parallelism and an MoE layer's ep and etp may differ by\n"
         "  layer (plan files). MoE runs end with the busiest expert rank's load and the MoE\n"
         "  scratch the forecast sized (--json: moe, moe_scratch).\n"
         "  A transfer waiting longer than --comm-timeout-s [600] ends the job, naming the group.\n"
         "  An error on any rank ends every rank; ranks end when mpirun/srun dies.\n"
         "  Checkpoints carry a digest of their bytes and a checksum per dataset; --resume\n"
         "  takes the newest one that verifies (damaged ones, and ones without a digest, are\n"
         "  skipped with a warning). <ckpt-dir>/LOCK refuses a second job writing the same\n"
         "  folder.\n"
         "  A non-finite loss or gradient norm stops training (keeping the last good\n"
         "  checkpoint); --skip-nonfinite N skips the update of up to N such steps.\n") +
         kModelHelp + kClusterHelp + kPlanHelp,
     run_train}};

}  // namespace
}  // namespace stratagem::cli
