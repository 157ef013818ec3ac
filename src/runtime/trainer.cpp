#include "stratagem/trainer.hpp"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "src/runtime/arrival_allreduce.hpp"
#include "stratagem/comm.hpp"
#include "stratagem/error.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/output_file.hpp"
#include "stratagem/spec_json.hpp"
#include "stratagem/stop_signal.hpp"
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

// The step a --log-json line records; none for a line that is not such a record (kept as is).
std::optional<int64_t> logged_step(const std::string& line, const std::string& path) {
  nlohmann::json j;
  try {
    j = io::parse_json(line, path);
  } catch (const InputError&) {
    return std::nullopt;
  }
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return std::nullopt;
  return j["step"].get<int64_t>();
}

// On resume, steps logged after the checkpoint (by a run killed past it) are run again: drop
// their lines so the log holds each step once.
void truncate_log_after(const std::string& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  while (std::getline(in, line)) {
    if (const auto s = logged_step(line, path); s && *s > step) continue;
    kept += line + "\n";
  }
  in.close();
  io::write_output("--log-json", path, kept);
}

// A JSON number, or null for a non-finite value (JSON has no NaN).
std::string json_number(double v, const char* fmt) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// --log-json on rank 0: one line per step, each flushed and checked, so that a full disk ends
// the run naming the file instead of losing the log quietly.
class JsonLog {
 public:
  JsonLog(const std::optional<std::string>& path, std::optional<int64_t> resumed_at, bool mine) {
    if (!path || !mine) return;
    if (resumed_at) truncate_log_after(*path, *resumed_at);
    out_ = std::make_unique<io::OutputFile>(
        "--log-json", *path,
        resumed_at ? io::OutputFile::Mode::append : io::OutputFile::Mode::truncate);
  }
  void write(int64_t step, const StepResult& r, double tps, double mfu, bool finite) {
    if (!out_) return;
    std::fprintf(out_->stream(),
                 "{\"step\": %lld, \"loss\": %s, \"lr\": %s, \"grad_norm\": %s, "
                 "\"tokens_per_s\": %s, \"mfu\": %s%s}\n",
                 (long long)step, json_number(r.loss, "%.9g").c_str(),
                 json_number(r.lr, "%.9g").c_str(), json_number(r.grad_norm, "%.9g").c_str(),
                 json_number(tps, "%.6g").c_str(), json_number(mfu, "%.6g").c_str(),
                 finite ? "" : ", \"skipped\": true");
    out_->flush();
  }
  void close() {
    if (out_) out_->commit();
    out_.reset();
  }

 private:
  std::unique_ptr<io::OutputFile> out_;
};

// Test hook (STRATAGEM_TEST_HOLD_STEP=N or N:RANK): after step N the rank (all, or RANK) waits
// until the file STRATAGEM_TEST_HOLD_RELEASE exists or a stop signal arrives, so that a test
// can signal a run that is certainly still training, on a fast machine or a loaded one. N = 0
// holds just before the training loop, where a signal ends the rank at once, and says so on
// stderr (unbuffered: the test waits for that line).
void hold_for_test(int64_t step, int rank) {
  const char* hold = std::getenv("STRATAGEM_TEST_HOLD_STEP");
  if (!hold) return;
  char* end = nullptr;
  const long at = std::strtol(hold, &end, 10);
  if (at != step || (*end == ':' && std::atoi(end + 1) != rank)) return;
  const char* release = std::getenv("STRATAGEM_TEST_HOLD_RELEASE");
  if (step == 0) std::fprintf(stderr, "stratagem train: held before the training loop (test)\n");
  while (pending_stop_signal() == 0 && !(release && std::filesystem::exists(release)))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

// The checkpoint folder, before anything is loaded: one job writes it at a time (the lock, on
// rank 0), half-written files of a killed job go, and --overwrite removes another run's
// checkpoints (a fresh run without it was refused by the CLI).
std::unique_ptr<CheckpointLock> take_checkpoint_folder(MPI_Comm world, const TrainerOptions& o) {
  std::unique_ptr<CheckpointLock> lock;
  if (!o.ckpt_dir) return lock;
  if (rank_of(world) == 0) {
    lock = std::make_unique<CheckpointLock>(*o.ckpt_dir);
    clean_partial_checkpoints(*o.ckpt_dir);
    if (o.overwrite) remove_checkpoints(*o.ckpt_dir);
  }
  WatchdogScope guard("barrier after taking the checkpoint lock (world)", not_arrived(world));
  MPI_Barrier(world);
  return lock;
}

// Flags that contradict the checkpoint resumed from (the same verdict on every rank: all read
// the same checkpoint). Another seed would continue on another data stream (the sampler is a
// function of seed and step) without a word; --steps below the checkpoint's step would do
// nothing and say nothing.
void check_resume_flags(const ResumePoint& from, const TrainerOptions& o) {
  if (from.meta.seed != o.exec.seed)
    throw InputError("--seed " + std::to_string(o.exec.seed) + ": the checkpoint " + from.path +
                     " was written with seed " + std::to_string(from.meta.seed) +
                     ", and the data stream follows the seed: resume with --seed " +
                     std::to_string(from.meta.seed));
  if (o.steps < from.meta.step)
    throw InputError("--steps " + std::to_string(o.steps) + ": below the step of the checkpoint " +
                     from.path + " (" + std::to_string(from.meta.step) +
                     "): --resume trains on to --steps; give --steps " +
                     std::to_string(from.meta.step) + " or more");
}

std::optional<ResumePoint> resume_point(MPI_Comm world, const TrainerOptions& o,
                                        const std::vector<CheckpointTensor>& tensors,
                                        const ModelSpec& model) {
  if (!o.resume) return std::nullopt;
  std::string skipped;
  auto found = find_resumable_checkpoint(world, *o.ckpt_dir, tensors, to_json(model), &skipped);
  if (!found)
    throw InputError(
        "--resume: no complete checkpoint in --ckpt-dir " + *o.ckpt_dir +
        (skipped.empty() ? std::string() : " passes verification (skipped: " + skipped + ")"));
  check_resume_flags(*found, o);
  return found;
}

// Loads a checkpoint into the executor: its weights, optimizer state and step counts.
void restore(Executor& ex, Backend& backend, const std::vector<CheckpointTensor>& tensors,
             const ResumePoint& from, int64_t* skipped_steps) {
  if (on_host(backend)) {
    load_checkpoint(from.path, tensors, checkpoint_pieces(ex, false));
  } else {
    HostMirror mirror(backend, {&ex.model().params, &ex.optimizer().m(), &ex.optimizer().v()});
    mirror.download();  // pieces may cover part of a tensor: the rest keeps its values
    load_checkpoint(from.path, tensors, mirror.remap(checkpoint_pieces(ex, false)));
    mirror.upload();
  }
  ex.weights_loaded();
  *skipped_steps = from.meta.extra.value("skipped_nonfinite_steps", int64_t(0));
  ex.optimizer().set_steps_taken(from.meta.extra.value("optimizer_steps", from.meta.step));
}

// Writes the checkpoint of `done` steps; returns its path.
struct CheckpointWriter {
  MPI_Comm world;
  const ModelSpec& model;
  const Plan& plan;
  Backend& backend;
  const TrainerOptions& o;
  const std::vector<CheckpointTensor>& tensors;
  Executor& ex;

  std::string save(int64_t done, int64_t skipped_steps) const {
    int world_size = 1;
    MPI_Comm_size(world, &world_size);
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
    const AdamWConfig& adamw = ex.optimizer().config();
    // The optimizer's settings: what a reader needs to bound how far two runs' weights may
    // differ (test/runtime/tolerance.py), beside the step count its bias correction uses.
    meta.extra = {{"rng", "counter-based: samples are a function of (seed, step, sample index)"},
                  {"optimizer",
                   {{"kind", "adamw"},
                    {"beta1", adamw.beta1},
                    {"beta2", adamw.beta2},
                    {"eps", adamw.eps},
                    {"weight_decay", adamw.weight_decay}}},
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
    return *o.ckpt_dir + "/" + checkpoint_name(done);
  }
};

// Stops training on a non-finite step past what --skip-nonfinite tolerates.
void check_finite(int64_t step, const StepResult& r, int64_t skipped_steps, const TrainerOptions& o,
                  const std::string& last_checkpoint) {
  if (skipped_steps <= o.skip_nonfinite) return;
  throw std::runtime_error(
      "step " + std::to_string(step) + ": non-finite loss " + json_number(r.loss, "%g") +
      " / gradient norm " + json_number(r.grad_norm, "%g") + ": training stopped (" +
      std::to_string(skipped_steps - 1) + " such steps tolerated by --skip-nonfinite " +
      std::to_string(o.skip_nonfinite) + "); the last good checkpoint " +
      (last_checkpoint.empty() ? std::string("(none written by this run)") : last_checkpoint) +
      " is kept: resume from it with a lower --lr, or raise --skip-nonfinite");
}

// Rank 0's line for a step (and its warning for a skipped one).
void print_step(int64_t s, int64_t start, double elapsed, const StepResult& r, double tps,
                double mfu, bool finite, int64_t skipped_steps, const TrainerOptions& o) {
  if (o.quiet) return;
  if (!finite)
    std::fprintf(stderr,
                 "stratagem train: warning: step %lld: non-finite loss or gradient norm: "
                 "update skipped (%lld of %d tolerated by --skip-nonfinite)\n",
                 (long long)s + 1, (long long)skipped_steps, o.skip_nonfinite);
  if ((s + 1) % o.log_every != 0 && s + 1 != o.steps) return;
  const double left = elapsed / double(s + 1 - start) * double(o.steps - s - 1);
  std::printf(
      "step %6lld/%lld | loss %.6f | lr %.3e | grad norm %.4f | %.0f tok/s | MFU %.1f%% | "
      "%.0f s left\n",
      (long long)s + 1, (long long)o.steps, r.loss, r.lr, r.grad_norm, tps, 100 * mfu, left);
  std::fflush(stdout);
}

// All ranks agree at the step boundary: > 0 a stop signal, -1 --stop-after, 0 go on. `comm`:
// the world's duplicate for this agreement.
int agree_on_stop(MPI_Comm comm, int64_t steps_this_run, const TrainerOptions& o) {
  int stop = pending_stop_signal();
  if (o.stop_after > 0 && steps_this_run >= o.stop_after) stop = -1;  // a time-boxed run
  int any =
      allreduce_max_naming_late(comm, stop, "all-reduce of stop signals (world)", o.comm_timeout_s);
  if (stop < 0 && any == 0) any = -1;
  if (any > 0) stop_signal_reached_boundary();
  return any;
}
}  // namespace

namespace {
// The training loop from `start` to o.steps: steps, logs, checkpoints, and the stop agreed at
// each step boundary.
TrainSummary run_steps(MPI_Comm world, const ModelSpec& model, const ClusterSpec& cluster,
                       const Plan& plan, Executor& ex, const CheckpointWriter& writer, JsonLog& log,
                       int64_t start, int64_t skipped_steps, const TrainerOptions& o) {
  const int rank = rank_of(world);
  int world_size = 1;
  MPI_Comm_size(world, &world_size);
  const double tokens_per_step = double(plan.global_batch) * model.seq_len;
  const double flops_per_step = model_flops_per_iteration(model, plan.global_batch);
  const double peak = cluster.gpu.peak_flops(plan.dtype) * world_size;
  TrainSummary summary;
  double elapsed = 0;
  // The stop agreement's own communicator: its arrival messages never meet the job's.
  struct OwnComm {
    explicit OwnComm(MPI_Comm of) {
      WatchdogScope guard("duplicating the world communicator (world)", not_arrived(of));
      MPI_Comm_dup(of, &comm);
    }
    ~OwnComm() { MPI_Comm_free(&comm); }
    MPI_Comm comm = MPI_COMM_NULL;
  } own(world);
  const MPI_Comm stop_comm = own.comm;
  hold_for_test(0, rank);
  defer_stop_signals(true);
  for (int64_t s = start; s < o.steps; ++s) {
    summary.last = ex.step(s);
    const StepResult& last = summary.last;
    elapsed += last.time_s;
    const double tps = tokens_per_step / last.time_s;
    const double mfu = flops_per_step / last.time_s / peak;
    // Loss and norm are all-reduced: every rank takes the same decision.
    const bool finite = std::isfinite(last.loss) && std::isfinite(last.grad_norm);
    if (!finite) check_finite(s + 1, last, ++skipped_steps, o, summary.checkpoint);
    if (rank == 0) {
      print_step(s, start, elapsed, last, tps, mfu, finite, skipped_steps, o);
      log.write(s + 1, last, tps, mfu, finite);
    }
    summary.steps_completed = s + 1;
    hold_for_test(s + 1, rank);
    const int any = agree_on_stop(stop_comm, s + 1 - start, o);
    const bool last_step = s + 1 == o.steps;
    if (o.ckpt_dir && (any || last_step || (o.ckpt_every > 0 && (s + 1) % o.ckpt_every == 0))) {
      summary.checkpoint = writer.save(s + 1, skipped_steps);
      if (rank == 0 && !o.quiet) std::printf("checkpoint %s\n", summary.checkpoint.c_str());
    }
    if (any && !last_step) {
      if (rank == 0 && !o.quiet)
        std::printf("%s: checkpointed at step %lld, exiting to be resumed\n",
                    any > 0 ? ("signal " + std::to_string(any)).c_str() : "--stop-after",
                    (long long)s + 1);
      break;
    }
  }
  return summary;
}
}  // namespace

TrainSummary train(MPI_Comm world, const ModelSpec& model, const ClusterSpec& cluster,
                   const Plan& plan, Backend& backend, const TokenDataset& data,
                   const TrainerOptions& o) {
  const int rank = rank_of(world);
  set_watchdog(o.comm_timeout_s, "stratagem train: error on rank " + std::to_string(rank) + ": ");
  const auto lock = take_checkpoint_folder(world, o);
  const auto tensors = checkpoint_tensors(model);
  const std::optional<ResumePoint> resume_from = resume_point(world, o, tensors, model);
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
    restore(ex, backend, tensors, *resume_from, &skipped_steps);
    start = resume_from->meta.step;
    if (rank == 0 && !o.quiet)
      std::printf("resumed from %s at step %lld\n", resume_from->path.c_str(), (long long)start);
  }
  JsonLog log(o.log_json, resume_from ? std::optional<int64_t>(start) : std::nullopt, rank == 0);
  const CheckpointWriter writer{world, model, plan, backend, o, tensors, ex};
  TrainSummary summary =
      run_steps(world, model, cluster, plan, ex, writer, log, start, skipped_steps, o);
  log.close();
  // The last step is traced: by then allocations and caches have settled.
  if (o.trace_path)
    write_measured_trace(world, *o.trace_path, model, cluster, plan, ex.program(), state.stage(),
                         summary.last);
  summary.high_water_bytes = ex.high_water_bytes();
  summary.host_high_water_bytes = ex.host_high_water_bytes();
  summary.moe_busiest_load = ex.moe_busiest_load();
  summary.moe_scratch = ex.moe_scratch_use();
  return summary;
}

}  // namespace stratagem
