#include <unistd.h>

#include <climits>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "src/cli/command.hpp"
#include "src/cli/launch.hpp"
#include "src/io/atomic_file.hpp"
#include "stratagem/backend.hpp"
#include "stratagem/checkpoint.hpp"
#include "stratagem/trainer.hpp"

namespace stratagem::cli {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
void on_signal(int sig) {
  g_stop_signal = sig;
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
  const std::string backend_name = a.value("--backend").value_or("cpu");
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
  ClusterSpec cluster = cluster_from_args(a, "cpu-local");
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
  if (backend_name != "cpu")
    throw NotSupported("--backend " + backend_name + ": only the cpu backend runs training so far");
  // The CPU backend computes in fp32: its plan says so, so the forecast it is compared with
  // counts the same bytes.
  if (!dtype_given) plan.dtype = Dtype::fp32;
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
  if (world_rank() == 0 && !json)
    std::printf(
        "train: %s, %d ranks (%s), backend %s (fp32), local rank of rank 0: %d, data %s (%lld "
        "tokens)\n",
        model.name.c_str(), world_size(), plan.describe().c_str(), backend_name.c_str(), local,
        data_path.c_str(), (long long)data.size());
  auto backend = make_cpu_backend();
  TrainSummary r = train(MPI_COMM_WORLD, model, cluster, plan, *backend, data, o, &g_stop_signal);
  int64_t high[2] = {r.high_water_bytes, r.host_high_water_bytes};
  MPI_Allreduce(MPI_IN_PLACE, high, 2, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
  if (json)
    print_json({{"steps_completed", r.steps_completed},
                {"loss", r.last.loss},
                {"grad_norm", r.last.grad_norm},
                {"lr", r.last.lr},
                {"tokens_per_s", double(plan.global_batch) * model.seq_len / r.last.time_s},
                {"high_water_bytes", high[0]},
                {"host_high_water_bytes", high[1]},
                {"checkpoint", r.checkpoint}});
  return 0;
}

Register reg{
    {"train", "run the training loop of a plan with real kernels (CPU backend)",
     std::string(
         "usage: mpirun -np N stratagem train --model M --cluster cpu-local "
         "(--plan FILE | shorthand flags) --data FILE --steps S\n"
         "       [--ckpt-dir D --ckpt-every K --keep 3] [--resume] [--stop-after N] [--trace "
         "FILE.h5]\n"
         "       [--seed X] [--log-json FILE] [--log-every N] [--lr 1e-3 --min-lr --warmup N\n"
         "       --weight-decay 0.1 --grad-clip 1.0] [--backend cpu] [--comm-timeout-s 600] "
         "[--json]\n"
         "       [--skip-nonfinite 0]\n"
         "  SIGUSR1/SIGTERM: checkpoint at the next step boundary on all ranks, exit 0.\n"
         "  The cpu backend computes in fp32 (the plan's dtype unless --dtype is given).\n"
         "  A transfer waiting longer than --comm-timeout-s ends the job, naming the group.\n"
         "  An error on any rank ends every rank; ranks end when mpirun/srun dies.\n"
         "  Checkpoints carry a checksum per dataset; --resume takes the newest one that\n"
         "  verifies (damaged ones are skipped with a warning). <ckpt-dir>/LOCK refuses a\n"
         "  second job writing the same folder.\n"
         "  A non-finite loss or gradient norm stops training (keeping the last good\n"
         "  checkpoint); --skip-nonfinite N skips the update of up to N such steps.\n") +
         kModelHelp + kClusterHelp + kPlanHelp,
     run_train}};

}  // namespace
}  // namespace stratagem::cli
