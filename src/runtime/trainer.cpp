#include "stratagem/trainer.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "src/io/atomic_file.hpp"
#include "stratagem/comm.hpp"
#include "stratagem/error.hpp"
#include "stratagem/spec_json.hpp"
#include "stratagem/watchdog.hpp"
#include "stratagem/workload.hpp"

namespace stratagem {

namespace {
// Checkpoints read and write host memory. On a device backend the weights and optimizer
// states go through host copies made for the occasion, and the pieces' pointers are moved
// onto them (the CPU backend's tensors are host memory already).
class HostMirror {
 public:
  HostMirror(Backend& be, std::initializer_list<const Tensor*> tensors) : be_(be) {
    for (const Tensor* t : tensors)
      if (t->defined()) regions_.push_back({*t, std::vector<float>(size_t(t->numel()))});
  }
  std::vector<CheckpointPiece> remap(std::vector<CheckpointPiece> pieces) {
    for (CheckpointPiece& p : pieces) {
      const auto at = reinterpret_cast<uintptr_t>(p.data);
      for (Region& r : regions_) {
        const auto begin = reinterpret_cast<uintptr_t>(r.device.data);
        if (at >= begin && at < begin + r.device.bytes()) {
          p.data = r.host.data() + (at - begin) / sizeof(float);
          break;
        }
      }
    }
    return pieces;
  }
  void download() {
    for (Region& r : regions_) be_.download(r.host.data(), r.device);
  }
  void upload() {
    for (Region& r : regions_) be_.upload(r.device, r.host.data());
    be_.synchronize();
  }

 private:
  struct Region {
    Tensor device;
    std::vector<float> host;
  };
  Backend& be_;
  std::vector<Region> regions_;
};
bool on_host(const Backend& be) {
  return be.name() == "cpu";
}

int rank_of(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
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

// A JSON number, or null for a non-finite value (JSON has no NaN).
std::string json_number(double v, const char* fmt) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}
}  // namespace

TrainSummary train(MPI_Comm world, const ModelSpec& model, const ClusterSpec& cluster,
                   const Plan& plan, Backend& backend, const TokenDataset& data,
                   const TrainerOptions& o, const volatile std::sig_atomic_t* stop_signal) {
  const int rank = rank_of(world);
  set_watchdog(o.comm_timeout_s, "stratagem train: error on rank " + std::to_string(rank) + ": ");
  auto barrier = [&](const char* what) {
    WatchdogScope guard(std::string(what) + " (world)", not_arrived(world));
    MPI_Barrier(world);
  };
  // One job writes a checkpoint folder at a time; what a killed one left half-written goes.
  std::unique_ptr<CheckpointLock> lock;
  if (o.ckpt_dir) {
    if (rank == 0) {
      lock = std::make_unique<CheckpointLock>(*o.ckpt_dir);
      clean_partial_checkpoints(*o.ckpt_dir);
    }
    barrier("barrier after taking the checkpoint lock");
  }
  const auto tensors = checkpoint_tensors(model);
  std::optional<ResumePoint> resume_from;
  if (o.resume) {
    std::string skipped;
    resume_from = find_resumable_checkpoint(world, *o.ckpt_dir, tensors, to_json(model), &skipped);
    if (!resume_from)
      throw InputError(
          "--resume: no complete checkpoint in --ckpt-dir " + *o.ckpt_dir +
          (skipped.empty() ? std::string() : " passes verification (skipped: " + skipped + ")"));
  }
  data.check_fits(model.seq_len, model.vocab);
  // MPI communicators (the CPU backend's) move on while the rank computes, as the forecast's
  // network does; stopped when training ends, before anything else of MPI is torn down.
  struct Progress {
    explicit Progress(bool on) : on(on) {
      if (on) start_mpi_progress();
    }
    ~Progress() {
      if (on) stop_mpi_progress();
    }
    bool on;
  } progress(!o.make_comm);
  ParallelState state(world, plan, cluster, o.comm_timeout_s, o.make_comm);
  DatasetSamples samples(data, o.exec.seed);
  Executor ex(state, model, plan, backend, samples, o.exec);

  int64_t start = 0, skipped_steps = 0;
  if (resume_from) {
    const CheckpointMeta& meta = resume_from->meta;
    if (on_host(backend)) {
      load_checkpoint(resume_from->path, tensors, checkpoint_pieces(ex, false));
    } else {
      HostMirror mirror(backend, {&ex.model().params, &ex.optimizer().m(), &ex.optimizer().v()});
      mirror.download();  // pieces may cover part of a tensor: the rest keeps its values
      load_checkpoint(resume_from->path, tensors, mirror.remap(checkpoint_pieces(ex, false)));
      mirror.upload();
    }
    ex.weights_loaded();
    skipped_steps = meta.extra.value("skipped_nonfinite_steps", int64_t(0));
    ex.optimizer().set_steps_taken(meta.extra.value("optimizer_steps", meta.step));
    start = meta.step;
    if (rank == 0 && !o.quiet)
      std::printf("resumed from %s at step %lld\n", resume_from->path.c_str(), (long long)start);
  }
  FILE* jlog = nullptr;
  if (o.log_json && rank == 0) {
    if (resume_from) truncate_log_after(*o.log_json, start);
    jlog = std::fopen(o.log_json->c_str(), resume_from ? "a" : "w");
    if (!jlog) throw InputError("--log-json " + *o.log_json + ": cannot open");
  }
  const double tokens_per_step = double(plan.global_batch) * model.seq_len;
  const double flops_per_step = model_flops_per_iteration(model, plan.global_batch);
  int world_size = 1;
  MPI_Comm_size(world, &world_size);
  const double peak = cluster.gpu.peak_flops(plan.dtype) * world_size;
  TrainSummary summary;
  auto save = [&](int64_t done) {
    CheckpointMeta meta;
    meta.step = done;
    meta.seed = o.exec.seed;
    meta.data_position = done * plan.global_batch;
    meta.model = to_json(model);
    meta.plan = to_json(plan);
    meta.layout = {{"world_size", world_size},
                   {"pp", plan.pp},
                   {"tp", plan.embedding.tp},
                   {"dp", plan.embedding.dp},
                   {"zero", plan.embedding.zero}};
    meta.extra = {{"rng", "counter-based: samples are a function of (seed, step, sample index)"},
                  {"optimizer_steps", ex.optimizer().steps_taken()},
                  {"skipped_nonfinite_steps", skipped_steps}};
    if (on_host(backend)) {
      save_checkpoint(world, *o.ckpt_dir, meta, tensors, checkpoint_pieces(ex, true), o.keep);
    } else {
      HostMirror mirror(backend, {&ex.model().params, &ex.optimizer().m(), &ex.optimizer().v()});
      mirror.download();
      save_checkpoint(world, *o.ckpt_dir, meta, tensors, mirror.remap(checkpoint_pieces(ex, true)),
                      o.keep);
    }
    summary.checkpoint = *o.ckpt_dir + "/" + checkpoint_name(done);
    if (rank == 0 && !o.quiet) std::printf("checkpoint %s\n", summary.checkpoint.c_str());
  };
  double elapsed = 0;
  StepResult last;
  for (int64_t s = start; s < o.steps; ++s) {
    last = ex.step(s);
    elapsed += last.time_s;
    const double tps = tokens_per_step / last.time_s;
    const double mfu = flops_per_step / last.time_s / peak;
    // Loss and norm are all-reduced: every rank takes the same decision.
    const bool finite = std::isfinite(last.loss) && std::isfinite(last.grad_norm);
    if (!finite && ++skipped_steps > o.skip_nonfinite)
      throw std::runtime_error(
          "step " + std::to_string(s + 1) + ": non-finite loss " + json_number(last.loss, "%g") +
          " / gradient norm " + json_number(last.grad_norm, "%g") + ": training stopped (" +
          std::to_string(skipped_steps - 1) + " such steps tolerated by --skip-nonfinite " +
          std::to_string(o.skip_nonfinite) + "); the last good checkpoint " +
          (summary.checkpoint.empty() ? std::string("(none written by this run)")
                                      : summary.checkpoint) +
          " is kept: resume from it with a lower --lr, or raise --skip-nonfinite");
    if (rank == 0) {
      if (!finite && !o.quiet)
        std::fprintf(stderr,
                     "stratagem train: warning: step %lld: non-finite loss or gradient norm: "
                     "update skipped (%lld of %d tolerated by --skip-nonfinite)\n",
                     (long long)s + 1, (long long)skipped_steps, o.skip_nonfinite);
      if (!o.quiet && ((s + 1) % o.log_every == 0 || s + 1 == o.steps)) {
        const double left = elapsed / double(s + 1 - start) * double(o.steps - s - 1);
        std::printf(
            "step %6lld/%lld | loss %.6f | lr %.3e | grad norm %.4f | %.0f tok/s | MFU %.1f%% | "
            "%.0f s left\n",
            (long long)s + 1, (long long)o.steps, last.loss, last.lr, last.grad_norm, tps,
            100 * mfu, left);
        std::fflush(stdout);
      }
      if (jlog) {
        std::fprintf(jlog,
                     "{\"step\": %lld, \"loss\": %s, \"lr\": %s, \"grad_norm\": %s, "
                     "\"tokens_per_s\": %s, \"mfu\": %s%s}\n",
                     (long long)s + 1, json_number(last.loss, "%.9g").c_str(),
                     json_number(last.lr, "%.9g").c_str(),
                     json_number(last.grad_norm, "%.9g").c_str(), json_number(tps, "%.6g").c_str(),
                     json_number(mfu, "%.6g").c_str(), finite ? "" : ", \"skipped\": true");
        std::fflush(jlog);
      }
    }
    summary.steps_completed = s + 1;
    // All ranks agree on a pending stop signal at the step boundary.
    int stop = stop_signal ? *stop_signal : 0, any = 0;
    if (o.stop_after > 0 && s + 1 - start >= o.stop_after) stop = -1;  // a time-boxed run
    {
      WatchdogScope guard("all-reduce of stop signals (world)", not_arrived(world));
      MPI_Allreduce(&stop, &any, 1, MPI_INT, MPI_MAX, world);
    }
    if (stop < 0 && any == 0) any = -1;
    const bool last_step = s + 1 == o.steps;
    if (o.ckpt_dir && (any || last_step || (o.ckpt_every > 0 && (s + 1) % o.ckpt_every == 0)))
      save(s + 1);
    if (any && !last_step) {
      if (rank == 0 && !o.quiet)
        std::printf("%s: checkpointed at step %lld, exiting to be resumed\n",
                    any > 0 ? ("signal " + std::to_string(any)).c_str() : "--stop-after",
                    (long long)s + 1);
      break;
    }
  }
  if (jlog) std::fclose(jlog);
  // The last step is traced: by then allocations and caches have settled.
  if (o.trace_path)
    write_measured_trace(world, *o.trace_path, model, cluster, plan, ex.program(), state.stage(),
                         last);
  summary.last = last;
  summary.high_water_bytes = ex.high_water_bytes();
  summary.host_high_water_bytes = ex.host_high_water_bytes();
  return summary;
}

}  // namespace stratagem
