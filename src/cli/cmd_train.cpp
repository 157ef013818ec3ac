#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/cli/command.hpp"
#include "src/cli/launch.hpp"
#include "src/io/atomic_file.hpp"
#include "stratagem/backend.hpp"
#include "stratagem/checkpoint.hpp"
#include "stratagem/cuda_device.hpp"
#include "stratagem/trainer.hpp"

namespace stratagem::cli {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
void on_signal(int sig) {
  g_stop_signal = sig;
}

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
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open (the GPU peak table)");
  const auto table = nlohmann::json::parse(in, nullptr, true, /*ignore_comments=*/true);
  std::string best_key, best;
  for (const auto& [key, cluster] : table.items())
    if (name.find(key) != std::string::npos && key.size() > best_key.size())
      best_key = key, best = cluster.get<std::string>();
  if (best.empty())
    throw InputError("--backend cuda: GPU '" + name + "' is not in " + path +
                     "; pass --cluster with a description of this node (its peak FLOP/s sets MFU)");
  return best;
}

int run_train(Args& a) {
  // Installed first: a time-limit signal during start-up (data, checkpoint loading) must still
  // end in a checkpoint-and-exit, not in a killed rank.
  std::signal(SIGUSR1, on_signal);
  std::signal(SIGTERM, on_signal);
  const auto data_path = a.required("--data");
  // Count flags take bounds, so a negative or absurd value is one clear line (exit 2).
  const int steps = a.int_value("--steps", 1, 1000000000).value_or(-1);
  const auto ckpt_dir = a.value("--ckpt-dir");
  const int ckpt_every = a.int_value("--ckpt-every", 0, 1000000000).value_or(0);
  const int keep = a.int_value("--keep", 1, 1000000).value_or(3);
  const bool resume = a.flag("--resume");
  const int stop_after = a.int_value("--stop-after").value_or(-1);
  const auto trace_path = a.value("--trace");
  const auto log_json = a.value("--log-json");
  const int log_every = a.int_value("--log-every", 1, 1000000000).value_or(1);
  const std::string backend_name = a.value("--backend").value_or(default_backend());
  // Without --comm: mpi on the cpu backend; on cuda, nccl when every rank of the node has a
  // GPU of its own, else mpi staged through host memory (decided once the ranks agree below).
  const auto comm_arg = a.value("--comm");
  std::string comm_name = comm_arg.value_or(backend_name == "cuda" ? "nccl" : "mpi");
  const bool json = a.flag("--json");
  const bool dtype_given = a.value("--dtype").has_value();
  TrainerOptions o;
  o.steps = steps;
  o.ckpt_dir = ckpt_dir;
  o.ckpt_every = ckpt_every;
  o.keep = keep;
  o.resume = resume;
  o.stop_after = stop_after;
  o.trace_path = trace_path;
  o.log_json = log_json;
  o.log_every = log_every;
  o.quiet = json;
  o.comm_timeout_s = a.double_value("--comm-timeout-s").value_or(600);
  o.skip_nonfinite = a.int_value("--skip-nonfinite").value_or(0);
  ExecutorOptions& opt = o.exec;
  opt.seed = static_cast<uint64_t>(a.int_value("--seed", 0, INT_MAX).value_or(1234));
  opt.schedule.max_lr = static_cast<float>(a.double_value("--lr").value_or(1e-3));
  opt.schedule.min_lr =
      static_cast<float>(a.double_value("--min-lr").value_or(opt.schedule.max_lr / 10));
  opt.schedule.warmup_steps = a.int_value("--warmup", 0, 1000000000).value_or(0);
  opt.adamw.weight_decay = static_cast<float>(a.double_value("--weight-decay").value_or(0.1));
  opt.grad_clip = static_cast<float>(a.double_value("--grad-clip").value_or(1.0));
  ModelSpec model = model_from_args(a);
  const bool nodes_given = a.value("--nodes").has_value();
  // On a GPU the modeled node is the one holding this GPU's peak (data/gpus.json), so the
  // log's MFU is measured against it.
  const std::string default_cluster =
      backend_name == "cuda" && !a.value("--cluster") ? cluster_for_gpu() : "cpu-local";
  ClusterSpec cluster = cluster_from_args(a, default_cluster.c_str());
  if (!nodes_given) {
    // Without --nodes the modeled cluster is the one we were launched on: a partly used node
    // counts as a smaller node.
    const int g = cluster.node.gpus_per_node;
    if (world_size() < g)
      cluster.node.gpus_per_node = world_size(), cluster.nodes = 1;
    else if (world_size() % g == 0)
      cluster.nodes = world_size() / g;
  }
  Plan plan = plan_from_args(a, model, cluster);
  a.finish();
  if (steps < 1) throw InputError(a.command() + ": --steps: expected >= 1");
  for (const auto& [flag, path] : {std::pair{"--trace", trace_path}, {"--log-json", log_json}})
    if (path) {
      std::error_code ec;  // a name the file system rejects is treated as missing
      if (std::filesystem::is_directory(*path, ec))
        throw InputError(a.command() + ": " + flag + " " + *path +
                         ": is a directory, expected a file name");
      const auto dir = std::filesystem::path(*path).parent_path();
      if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
        throw InputError(a.command() + ": " + flag + " " + *path + ": directory " + dir.string() +
                         " does not exist");
    }
  if (ckpt_every < 0) throw InputError(a.command() + ": --ckpt-every: expected >= 0");
  if (ckpt_every > 0 && !ckpt_dir)
    throw InputError(a.command() + ": --ckpt-every needs --ckpt-dir");
  if (resume && !ckpt_dir) throw InputError(a.command() + ": --resume needs --ckpt-dir");
  if (o.skip_nonfinite < 0)
    throw InputError(a.command() + ": --skip-nonfinite: expected a count >= 0");
  if (!(o.comm_timeout_s > 0))
    throw InputError(a.command() + ": --comm-timeout-s: expected a number > 0");
  if (backend_name != "cpu" && backend_name != "cuda")
    throw InputError(a.command() + ": --backend: expected cpu|cuda, got '" + backend_name + "'");
  if (comm_name != "mpi" && comm_name != "nccl")
    throw InputError(a.command() + ": --comm: expected mpi|nccl, got '" + comm_name + "'");
  if (backend_name == "cpu" && comm_name != "mpi")
    throw InputError(a.command() + ": --comm nccl needs --backend cuda");
  if (backend_name == "cpu") {
    // The CPU backend computes in fp32: its plan says so, so the forecast it is compared with
    // counts the same bytes.
    if (!dtype_given) plan.dtype = Dtype::fp32;
  } else {
    if (plan.dtype != Dtype::fp32 && plan.dtype != Dtype::bf16)
      throw InputError(a.command() + ": --dtype " + to_string(plan.dtype) +
                       ": the cuda backend computes in bf16 or fp32");
    check_cuda_available(a.command());
    // Without --comm, NCCL when the plugin has it; --comm nccl without it is refused here,
    // before any rank starts work.
    if (!comm_arg && !cuda::have_nccl()) comm_name = "mpi";
    if (comm_name == "nccl" && !cuda::have_nccl())
      throw InputError(a.command() + ": --comm nccl: the CUDA plugin " + cuda::plugin_path() +
                       " was built without NCCL; use --comm mpi");
    // Checkpoints and the measured memory read host memory today.
    if (ckpt_dir)
      throw NotSupported(
          "--ckpt-dir with --backend cuda: checkpoints read the weights from "
          "host memory; device-memory checkpoints are not implemented yet");
  }
  // The world must match the plan before any work starts.
  if (world_size() != plan.world_size())
    throw InputError(a.command() + ": the plan needs " + std::to_string(plan.world_size()) +
                     " ranks (pp x tp x dp) but MPI started " + std::to_string(world_size()) +
                     "; use mpirun -np " + std::to_string(plan.world_size()));
  check_launch(a.command());
  check_runnable(model, plan, cluster, backend_name);
  opt.schedule.total_steps = steps;

  TokenDataset data = TokenDataset::load(data_path);
  data.check_fits(model.seq_len, model.vocab);
  // From here on ranks work together: an error on one rank must end all of them. Entering is
  // an agreement: a rank whose own input failed above ends the job with its message.
  begin_collective_phase(o.comm_timeout_s);
  const int local = local_rank();  // every rank must take part: it is a collective
  if (backend_name == "cuda" && !comm_arg && local_size() > cuda::device_count()) comm_name = "mpi";
  if (world_rank() == 0 && !json)
    std::printf(
        "train: %s, %d ranks (%s), backend %s (%s, comm %s), local rank of rank 0: %d, data %s "
        "(%lld tokens)\n",
        model.name.c_str(), world_size(), plan.describe().c_str(), backend_name.c_str(),
        to_string(plan.dtype), comm_name.c_str(), local, data_path.c_str(), (long long)data.size());
  std::unique_ptr<Backend> backend;
  if (backend_name == "cpu") {
    backend = make_cpu_backend();
  } else {
    const int device =
        choose_local_device(local, local_size(), cuda::device_count(), comm_name == "nccl");
    backend =
        cuda::make_backend(device, plan.dtype == Dtype::bf16 ? ScalarType::bf16 : ScalarType::fp32);
    o.make_comm = comm_name == "nccl" ? cuda::nccl_comm_factory(*backend)
                                      : cuda::host_staging_comm_factory(*backend);
    if (world_rank() == 0 && !json)
      std::printf("train: rank 0 drives CUDA device %d (%s), CUDA runtime %s\n", device,
                  cuda::device_name(device).c_str(), cuda::runtime_version().c_str());
  }
  TrainSummary r = train(MPI_COMM_WORLD, model, cluster, plan, *backend, data, o, &g_stop_signal);
  int64_t high[2] = {r.high_water_bytes, r.host_high_water_bytes};
  MPI_Allreduce(MPI_IN_PLACE, high, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  // What the device allocator held at most, beside the executor's ledger (which counts the
  // Program's buffers): the difference is cached blocks and rounding.
  int64_t device_reserved = 0;
  if (backend_name == "cuda")
    device_reserved = cuda::device_memory(*backend).reserved_high_water_bytes;
  MPI_Allreduce(MPI_IN_PLACE, &device_reserved, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (backend_name == "cuda" && world_rank() == 0 && !json)
    std::printf(
        "train: peak memory per rank %.2f GiB in the executor's ledger, %.2f GiB reserved "
        "by the CUDA caching allocator\n",
        double(high[0]) / (1 << 30), double(device_reserved) / (1 << 30));
  if (json)
    print_json({{"steps_completed", r.steps_completed},
                {"loss", r.last.loss},
                {"grad_norm", r.last.grad_norm},
                {"lr", r.last.lr},
                {"tokens_per_s", double(plan.global_batch) * model.seq_len / r.last.time_s},
                {"high_water_bytes", high[0]},
                {"host_high_water_bytes", high[1]},
                {"device_reserved_high_water_bytes", device_reserved},
                {"checkpoint", r.checkpoint}});
  return 0;
}

Register reg{
    {"train", "run the training loop of a plan with real kernels (CPU or CUDA backend)",
     std::string(
         "usage: mpirun -np N stratagem train --model M --cluster cpu-local "
         "(--plan FILE | shorthand flags) --data FILE --steps S\n"
         "       [--ckpt-dir D --ckpt-every K --keep 3] [--resume] [--stop-after N] [--trace "
         "FILE.h5]\n"
         "       [--seed X] [--log-json FILE] [--log-every N] [--lr 1e-3 --min-lr --warmup N\n"
         "       --weight-decay 0.1 --grad-clip 1.0] [--backend cpu|cuda] [--comm mpi|nccl]\n"
         "       [--comm-timeout-s 600] "
         "[--json]\n"
         "       [--skip-nonfinite 0]\n"
         "  SIGUSR1/SIGTERM: checkpoint at the next step boundary on all ranks, exit 0.\n"
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
         "  recompute, offload and sequence parallelism may differ by layer (plan files).\n"
         "  A transfer waiting longer than --comm-timeout-s ends the job, naming the group.\n"
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
