// stratagem: search, simulate and train hybrid-parallel Transformer jobs.
#include <mpi.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "src/cli/command.hpp"
#include "stratagem/cuda_device.hpp"
#include "stratagem/error.hpp"
#include "stratagem/hdf5_util.hpp"
#include "stratagem/output_file.hpp"
#include "stratagem/simulate.hpp"
#include "stratagem/version.hpp"
#include "stratagem/watchdog.hpp"

namespace stratagem::cli {

std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

namespace {
// This process's rank among, and the number of, the processes on its node (collective once).
std::pair<int, int> node_rank_and_size() {
  static std::pair<int, int> cached{-1, 0};
  if (cached.first < 0) {
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &cached.first);
    MPI_Comm_size(node, &cached.second);
    MPI_Comm_free(&node);
  }
  return cached;
}
}  // namespace

int local_rank() {
  return node_rank_and_size().first;
}
int local_size() {
  return node_rank_and_size().second;
}

namespace {
bool g_collective_phase = false;
bool g_agreed = false;
MPI_Comm g_agree_comm = MPI_COMM_NULL;  // a private duplicate: never matches a command's calls

// Every rank calls this exactly once (entering the collective phase, on an error before it, or
// after a successful command): the number of ranks that failed and the largest exit code.
// Waits at most `wait_s` (< 0: forever); returns false when the peers did not all arrive.
bool agree(bool ok, int code, double wait_s, int* failed, int* max_code) {
  g_agreed = true;
  int fail_in = ok ? 0 : 1;
  MPI_Request req[2];
  MPI_Iallreduce(&fail_in, failed, 1, MPI_INT, MPI_SUM, g_agree_comm, &req[0]);
  MPI_Iallreduce(&code, max_code, 1, MPI_INT, MPI_MAX, g_agree_comm, &req[1]);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int done = 0;
    MPI_Testall(2, req, &done, MPI_STATUSES_IGNORE);
    if (done) return true;
    if (wait_s >= 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > wait_s)
      return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
}  // namespace

void begin_collective_phase(double wait_s) {
  if (world_size() > 1 && !g_agreed) {
    int failed = 0, code = 0;
    if (!agree(true, kExitOk, wait_s, &failed, &code))
      throw std::runtime_error("peers did not reach the start of training within " +
                               std::to_string(int(wait_s)) +
                               " s (--comm-timeout-s): a rank stopped or died while loading");
    if (failed > 0) throw PeerFailed(code);
  }
  g_collective_phase = true;
}
bool collective_phase() {
  return g_collective_phase;
}
void finish_agreement() {
  if (world_size() > 1 && !g_agreed) {
    int failed = 0, code = 0;
    agree(true, kExitOk, -1, &failed, &code);
  }
}

namespace {
std::optional<double> g_comm_timeout_s;  // --comm-timeout-s as parsed by main
}  // namespace
std::optional<double> comm_timeout_flag_s() {
  return g_comm_timeout_s;
}
double comm_timeout_s() {
  return g_comm_timeout_s.value_or(kCollectiveTimeoutS);
}
const char* kCommonHelp =
    "  --comm-timeout-s S       every command: the longest a rank waits for another; past it\n"
    "                           the job ends naming the missing rank [MPI start-up 60,\n"
    "                           collectives 600]\n";

void print_json(const nlohmann::json& j) {
  if (world_rank() == 0) std::cout << j.dump(2) << std::endl;
}

}  // namespace stratagem::cli

namespace {
using stratagem::cli::Command;

void print_overview() {
  std::printf("stratagem %s: how should I train this Transformer on this cluster?\n\n",
              stratagem::kVersion);
  std::printf("usage: stratagem <command> [flags]   (every command takes --help and --json)\n\n");
  auto cmds = stratagem::cli::registry();
  std::sort(cmds.begin(), cmds.end(), [](auto& a, auto& b) { return a.name < b.name; });
  for (const auto& c : cmds) std::printf("  %-18s %s\n", c.name.c_str(), c.summary.c_str());
  std::printf("\nevery command takes:\n%s", stratagem::cli::kCommonHelp);
  std::printf("\nexit codes: 0 ok, 1 failure, 2 bad input, 3 no plan fits the memory budget\n");
}

// Longest registered command name that prefixes argv ("plan check" before "plan").
const Command* match(int argc, char** argv, int* consumed) {
  const Command* best = nullptr;
  int best_words = 0;
  for (const auto& c : stratagem::cli::registry()) {
    std::vector<std::string> words;
    size_t at = 0;
    while (at <= c.name.size()) {
      size_t sp = c.name.find(' ', at);
      if (sp == std::string::npos) sp = c.name.size();
      words.push_back(c.name.substr(at, sp - at));
      at = sp + 1;
    }
    if ((int)words.size() > argc - 1) continue;
    bool ok = true;
    for (size_t i = 0; i < words.size() && ok; ++i) ok = words[i] == argv[1 + i];
    if (ok && (int)words.size() > best_words) best = &c, best_words = (int)words.size();
  }
  *consumed = best_words;
  return best;
}
}  // namespace

namespace {
// Reports an error and ends the job, so that no rank ever waits for a failed peer.
// - In the collective phase (or for an internal error) the failing rank prints it, prefixed
//   with its rank, and aborts the job.
// - Before it, ranks agree (within a few seconds) on who failed: when all did (the same bad
//   input everywhere), rank 0 prints it once and all exit; when some did, each failing rank
//   prints its own, prefixed with its rank, and all exit with the largest code. A failing rank
//   whose peers do not arrive in time (they wait in some other call) prints and aborts.
// Returns the exit code of this rank.
int fail(const std::string& who, const char* kind, const char* what, int code,
         bool always_abort = false) {
  namespace cli = stratagem::cli;
  const int size = cli::world_size(), rank = cli::world_rank();
  // Flag errors raised by the argument parser name their command themselves; the line names
  // it once.
  const std::string prefix = who + ": ";
  if (std::strncmp(what, prefix.c_str(), prefix.size()) == 0) what += prefix.size();
  auto print = [&](bool with_rank) {
    if (with_rank)
      std::fprintf(stderr, "%s: %s on rank %d: %s\n", who.c_str(), kind, rank, what);
    else
      std::fprintf(stderr, "%s: %s: %s\n", who.c_str(), kind, what);
    std::fflush(stderr);
  };
  if (size == 1) {
    print(false);
    return code;
  }
  if (!cli::collective_phase() && !cli::g_agreed) {
    int failed = 0, max_code = code;
    if (cli::agree(false, code, 5.0, &failed, &max_code) && !always_abort) {
      if (failed < size)
        print(true);
      else if (rank == 0)
        print(false);
      return max_code;
    }
  }
  print(true);
  // Give the launcher a moment to forward the line before the abort tears the job down (300 ms
  // lost it now and then on a loaded machine; the job still ends well within 10 s).
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  MPI_Abort(MPI_COMM_WORLD, code);
  return code;
}

bool launched_by_mpirun_or_srun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMIX_RANK") ||
         std::getenv("PMI_RANK") || std::getenv("SLURM_STEP_ID");
}

// The launcher's word for an environment variable's integer (-1 when unset or not a number).
int env_int(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const char* v = std::getenv(n)) {
      char* end = nullptr;
      const long x = std::strtol(v, &end, 10);
      if (*v && *end == '\0' && x >= 0 && x <= INT32_MAX) return int(x);
    }
  return -1;
}

// Arms the watchdog over MPI_Init and the first collective, before any flag is parsed: the
// bound is --comm-timeout-s as written, else kStartUpTimeoutS (a bad value is refused later,
// with its message). MPI_Init waits inside the launcher's exchange, where MPI cannot say who is
// missing: the launcher's environment gives this rank and the job's size, which name the
// missing rank of two exactly and the suspects of more. Returns whether it is armed.
bool start_up_watchdog(const std::string& who, const std::vector<std::string>& args,
                       std::string* not_arrived) {
  if (!launched_by_mpirun_or_srun()) return false;
  double timeout_s = stratagem::cli::kStartUpTimeoutS;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string v;
    if (args[i] == "--comm-timeout-s" && i + 1 < args.size()) v = args[i + 1];
    if (args[i].rfind("--comm-timeout-s=", 0) == 0) v = args[i].substr(17);
    char* end = nullptr;
    const double x = v.empty() ? 0 : std::strtod(v.c_str(), &end);
    if (!v.empty() && *end == '\0' && x > 0 && x < 1e7) timeout_s = x;
  }
  const int rank = env_int({"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"});
  const int size = env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"});
  *not_arrived = rank >= 0 && size > 1 && rank < size
                     ? stratagem::not_arrived(rank, size)
                     : "not arrived: one or more ranks (stopped or died)";
  stratagem::set_watchdog(
      timeout_s, who + ": error" + (rank >= 0 ? " on rank " + std::to_string(rank) : "") + ": ");
  return true;
}

// Ranks launched by mpirun or srun die with their launcher: orphans must not go on writing
// checkpoints (or hold the checkpoint lock) after the job is gone.
void die_with_launcher() {
  if (!launched_by_mpirun_or_srun()) return;
  const pid_t parent = ::getppid();
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) std::_Exit(1);  // the launcher died before prctl
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    print_overview();
    return argc < 2 ? stratagem::kExitBadInput : 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::printf("stratagem %s\n", stratagem::kVersion);
    // The only command besides --backend cuda that loads the CUDA plugin: it says which CUDA
    // this binary would train with, or what is missing.
    std::printf("%s\n", stratagem::cuda::describe_plugin().c_str());
    return 0;
  }
  int consumed = 0;
  const Command* cmd = match(argc, argv, &consumed);
  if (!cmd) {
    std::fprintf(stderr, "stratagem: unknown command '%s' (see stratagem --help)\n", argv[1]);
    return stratagem::kExitBadInput;
  }
  std::vector<std::string> rest(argv + 1 + consumed, argv + argc);
  if (std::find(rest.begin(), rest.end(), "--help") != rest.end() ||
      std::find(rest.begin(), rest.end(), "-h") != rest.end()) {
    std::printf("%s%s", cmd->usage.c_str(), stratagem::cli::kCommonHelp);
    return 0;
  }
  die_with_launcher();
  const std::string who = "stratagem " + cmd->name;
  // Started without mpirun or srun, Open MPI's singleton forks a support daemon (orted) that
  // only MPI_Comm_spawn needs, which stratagem never calls: ~0.2 s of every command's start.
  // A user's own setting wins.
  setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
  // Threads: the CPU backend's communication moves on in a thread of its own while the rank
  // computes (train starts and stops it, src/runtime/trainer.cpp); without MULTIPLE it moves on
  // only in MPI calls.
  int thread_level = MPI_THREAD_SINGLE;
  // A rank stopped or dead while the job starts would hold the others in MPI's start-up
  // forever: the watchdog bounds it by --comm-timeout-s (kStartUpTimeoutS without it) when a
  // launcher started us.
  std::optional<stratagem::WatchdogScope> start_up;
  std::string absent;
  if (start_up_watchdog(who, rest, &absent))
    start_up.emplace("MPI start-up (MPI_Init and the first collective)", absent);
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &thread_level);
  // HDF5's own error stack would print a page for a damaged file: stratagem's errors say it in
  // one line (the readers check every call).
  stratagem::io::silence_hdf5_errors();
  MPI_Comm_dup(MPI_COMM_WORLD, &stratagem::cli::g_agree_comm);
  start_up.reset();
  int code = stratagem::kExitOk;
  // The watchdog over the collectives a command guards (a checkpoint's, a digest's) and its
  // bounded sections (a damaged HDF5 file that libhdf5 never finishes reading:
  // stratagem/hdf5_guard.hpp), bounded by --comm-timeout-s once it is parsed; `train` sets its own
  // prefix.
  const std::string prefix =
      stratagem::cli::world_size() == 1
          ? who + ": error: "
          : who + ": error on rank " + std::to_string(stratagem::cli::world_rank()) + ": ";
  stratagem::set_watchdog(0, prefix);
  try {
    stratagem::cli::Args args("stratagem " + cmd->name, rest);
    // One parse for every command, so that each takes the flag with the same bounds.
    stratagem::cli::g_comm_timeout_s =
        args.double_in("--comm-timeout-s", 1e-3, 1e7, "seconds in (0, 1e7]");
    stratagem::set_watchdog(stratagem::cli::comm_timeout_s(), prefix);
    code = cmd->run(args);
    stratagem::cli::finish_agreement();
  } catch (const stratagem::cli::PeerFailed& e) {
    code = e.code;  // the failing rank printed its message
  } catch (const stratagem::InputError& e) {
    code = fail(who, "error", e.what(), stratagem::kExitBadInput);
  } catch (const stratagem::NotSupported& e) {
    code = fail(who, "not supported yet", e.what(), stratagem::kExitBadInput);
  } catch (const std::bad_alloc&) {
    // The pre-checks (src/cli/memory_check.hpp) refuse what they can foresee; this is what
    // they missed, said in words.
    std::string by;
    char what[256];
    std::snprintf(what, sizeof what,
                  "out of memory: an allocation failed (this process may use %.1f GiB: %s); "
                  "try a smaller job",
                  double(stratagem::memory_limit_bytes(&by)) / double(1LL << 30), by.c_str());
    code = fail(who, "error", what, stratagem::kExitFailure, /*always_abort=*/true);
  } catch (const std::exception& e) {
    code = fail(who, "error", e.what(), stratagem::kExitFailure, /*always_abort=*/true);
  }
  if (stratagem::io::failed_hdf5_write()) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }
  MPI_Comm_free(&stratagem::cli::g_agree_comm);
  // What is still buffered reaches the launcher before MPI_Finalize ends its forwarding (at
  // exit it may be lost: a resume's output once came back as its first line only).
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Finalize();
  return code;
}
