#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <fstream>

#include "src/cli/command.hpp"
#include "src/cli/launch.hpp"
#include "src/io/atomic_file.hpp"
#include "stratagem/backend.hpp"
#include "stratagem/checkpoint.hpp"
#include "stratagem/executor.hpp"

namespace stratagem::cli {
namespace {

volatile std::sig_atomic_t g_stop_signal = 0;
void on_signal(int sig) {
  g_stop_signal = sig;
}

// On resume, steps logged after the checkpoint (by a run killed past it) are run again: drop
// their lines so the log holds each step once.
void truncate_log_after(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.contains("step") && j["step"].get<int64_t>() > step) continue;
    kept += line + "\n";
  }
  in.close();
  io::write_file_atomic(path, kept);
}

std::vector<CheckpointTensor> checkpoint_tensors(const ParamTable& table) {
  std::vector<CheckpointTensor> out;
  for (const auto& e : table.entries()) {
    CheckpointTensor t;
    t.name = e.name;
    for (int i = 0; i < e.shape.ndim(); ++i) t.shape.push_back(e.shape[i]);
    t.offset = e.offset;
    out.push_back(t);
  }
  return out;
}

// Every rank writes an even slice of the replicated state and its own ZeRO shard.
std::vector<CheckpointBuffer> checkpoint_buffers(Executor& ex, int dp_index, int dp) {
  const int64_t N = ex.table().size();
  const int64_t a = N * dp_index / dp, b = N * (dp_index + 1) / dp;
  std::vector<CheckpointBuffer> out;
  out.push_back({"params", ex.model().params.data + a, a, b});
  const int64_t s0 = ex.shard_begin(), s1 = ex.shard_end();
  if (s0 == 0 && s1 == N) {  // ZeRO-0: optimizer state is replicated
    out.push_back({"optimizer/m", ex.optimizer().m().data + a, a, b});
    out.push_back({"optimizer/v", ex.optimizer().v().data + a, a, b});
  } else {
    out.push_back({"optimizer/m", ex.optimizer().m().data, s0, s1});
    out.push_back({"optimizer/v", ex.optimizer().v().data, s0, s1});
  }
  return out;
}

std::vector<CheckpointBuffer> resume_buffers(Executor& ex) {
  const int64_t N = ex.table().size();
  return {{"params", ex.model().params.data, 0, N},
          {"optimizer/m", ex.optimizer().m().data, ex.shard_begin(), ex.shard_end()},
          {"optimizer/v", ex.optimizer().v().data, ex.shard_begin(), ex.shard_end()}};
}

int run_train(Args& a) {
  // Installed first: a time-limit signal during start-up (data, checkpoint loading) must still
  // end in a checkpoint-and-exit, not in a killed rank.
  std::signal(SIGUSR1, on_signal);
  std::signal(SIGTERM, on_signal);
  const auto data_path = a.required("--data");
  const int steps = a.int_value("--steps").value_or(-1);
  const auto ckpt_dir = a.value("--ckpt-dir");
  const int ckpt_every = a.int_value("--ckpt-every").value_or(0);
  const int keep = a.int_value("--keep").value_or(3);
  const bool resume = a.flag("--resume");
  const int stop_after = a.int_value("--stop-after").value_or(-1);
  const auto trace_path = a.value("--trace");
  const auto log_json = a.value("--log-json");
  const int log_every = a.int_value("--log-every").value_or(1);
  const std::string backend_name = a.value("--backend").value_or("cpu");
  const bool json = a.flag("--json");
  ExecutorOptions opt;
  opt.seed = static_cast<uint64_t>(a.int_value("--seed").value_or(1234));
  opt.schedule.max_lr = static_cast<float>(a.double_value("--lr").value_or(1e-3));
  opt.schedule.min_lr =
      static_cast<float>(a.double_value("--min-lr").value_or(opt.schedule.max_lr / 10));
  opt.schedule.warmup_steps = a.int_value("--warmup").value_or(0);
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
  if (ckpt_every < 0) throw InputError(a.command() + ": --ckpt-every: expected >= 0");
  if (ckpt_every > 0 && !ckpt_dir)
    throw InputError(a.command() + ": --ckpt-every needs --ckpt-dir");
  if (resume && !ckpt_dir) throw InputError(a.command() + ": --resume needs --ckpt-dir");
  if (backend_name != "cpu")
    throw NotSupported("--backend " + backend_name + ": only the cpu backend runs training so far");
  // The world must match the plan before any work starts.
  if (world_size() != plan.world_size())
    throw InputError(a.command() + ": the plan needs " + std::to_string(plan.world_size()) +
                     " ranks (pp x tp x dp) but MPI started " + std::to_string(world_size()) +
                     "; use mpirun -np " + std::to_string(plan.world_size()));
  check_launch(a.command());
  opt.schedule.total_steps = steps;

  std::optional<std::string> resume_from;
  if (resume) {
    resume_from = newest_checkpoint(*ckpt_dir, world_rank() == 0);
    if (!resume_from)
      throw InputError(a.command() + ": --resume: no complete checkpoint in --ckpt-dir " +
                       *ckpt_dir);
    CheckpointMeta meta = read_checkpoint_meta(*resume_from);
    if (meta.model != to_json(model))
      throw InputError(*resume_from + ": checkpoint is of a different model (" +
                       meta.model.value("name", "?") + ") than --model " + model.name);
  }

  TokenDataset data = TokenDataset::load(data_path);
  const int local = local_rank();  // every rank must take part: it is a collective
  if (world_rank() == 0 && !json)
    std::printf(
        "train: %s, %d ranks (%s), backend %s, local rank of rank 0: %d, data %s (%lld tokens)\n",
        model.name.c_str(), world_size(), plan.describe().c_str(), backend_name.c_str(), local,
        data_path.c_str(), (long long)data.size());
  auto backend = make_cpu_backend();
  Executor ex(MPI_COMM_WORLD, model, cluster, plan, *backend, data, opt);
  const int dp = plan.embedding.dp;
  const int dp_index = world_rank() % dp;
  int64_t start = 0;
  if (resume_from) {
    CheckpointMeta meta = read_checkpoint_meta(*resume_from);
    load_checkpoint(*resume_from, checkpoint_tensors(ex.table()), resume_buffers(ex));
    ex.optimizer().set_steps_taken(meta.step);
    start = meta.step;
    if (world_rank() == 0)
      std::printf("resumed from %s at step %lld\n", resume_from->c_str(), (long long)start);
  }
  FILE* jlog = nullptr;
  if (log_json && world_rank() == 0) {
    if (resume_from) truncate_log_after(*log_json, start);
    jlog = std::fopen(log_json->c_str(), resume_from ? "a" : "w");
    if (!jlog) throw InputError(a.command() + ": --log-json " + *log_json + ": cannot open");
  }
  const double tokens_per_step = double(plan.global_batch) * model.seq_len;
  const double flops_per_step = model_flops_per_iteration(model, plan.global_batch);
  const double peak = cluster.gpu.peak_flops(Dtype::fp32) * world_size();
  auto save = [&](int64_t done) {
    CheckpointMeta meta;
    meta.step = done;
    meta.seed = opt.seed;
    meta.data_position = done * plan.global_batch;
    meta.model = to_json(model);
    meta.plan = to_json(plan);
    meta.layout = {{"world_size", world_size()}, {"dp", dp}, {"zero", plan.embedding.zero}};
    meta.extra = {{"rng", "counter-based: samples are a function of (seed, step, sample index)"}};
    save_checkpoint(MPI_COMM_WORLD, *ckpt_dir, meta, checkpoint_tensors(ex.table()),
                    checkpoint_buffers(ex, dp_index, dp), keep);
    if (world_rank() == 0)
      std::printf("checkpoint %s/%s\n", ckpt_dir->c_str(), checkpoint_name(done).c_str());
  };
  double elapsed = 0;
  StepResult last;
  for (int64_t s = start; s < steps; ++s) {
    last = ex.step(s);
    elapsed += last.time_s;
    const double tps = tokens_per_step / last.time_s;
    const double mfu = flops_per_step / last.time_s / peak;
    if (world_rank() == 0) {
      if (!json && ((s + 1) % log_every == 0 || s + 1 == steps)) {
        const double left = elapsed / double(s + 1 - start) * double(steps - s - 1);
        std::printf(
            "step %6lld/%d | loss %.6f | lr %.3e | grad norm %.4f | %.0f tok/s | %.0f s left\n",
            (long long)s + 1, steps, last.loss, last.lr, last.grad_norm, tps, left);
        std::fflush(stdout);
      }
      if (jlog) {
        std::fprintf(jlog,
                     "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, "
                     "\"tokens_per_s\": %.6g, \"mfu\": %.6g}\n",
                     (long long)s + 1, last.loss, last.lr, last.grad_norm, tps, mfu);
        std::fflush(jlog);
      }
    }
    // All ranks agree on a pending stop signal at the step boundary.
    int stop = g_stop_signal, any = 0;
    if (stop_after > 0 && s + 1 - start >= stop_after) stop = -1;  // a time-boxed run
    MPI_Allreduce(&stop, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (stop < 0 && any == 0) any = -1;
    const bool last_step = s + 1 == steps;
    if (ckpt_dir && (any || last_step || (ckpt_every > 0 && (s + 1) % ckpt_every == 0)))
      save(s + 1);
    if (any && !last_step) {
      if (world_rank() == 0)
        std::printf("%s: checkpointed at step %lld, exiting to be resumed\n",
                    any > 0 ? ("signal " + std::to_string(any)).c_str() : "--stop-after",
                    (long long)s + 1);
      break;
    }
  }
  if (jlog) std::fclose(jlog);
  // The last step is traced: by then allocations and caches have settled.
  if (trace_path)
    write_measured_trace(MPI_COMM_WORLD, *trace_path, model, cluster, plan, ex.program(), last);
  if (json)
    print_json({{"steps_completed", last.step + 1},
                {"loss", last.loss},
                {"grad_norm", last.grad_norm},
                {"lr", last.lr},
                {"tokens_per_s", tokens_per_step / last.time_s},
                {"high_water_bytes", ex.high_water_bytes()},
                {"checkpoint", ckpt_dir ? *ckpt_dir + "/" + checkpoint_name(last.step + 1) : ""}});
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
         "       --weight-decay 0.1 --grad-clip 1.0] [--backend cpu] [--json]\n"
         "  SIGUSR1/SIGTERM: checkpoint at the next step boundary on all ranks, exit 0.\n") +
         kModelHelp + kClusterHelp + kPlanHelp,
     run_train}};

}  // namespace
}  // namespace stratagem::cli
