// stratagem: search, simulate and train hybrid-parallel Transformer jobs.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <utility>

#include "src/cli/command.hpp"
#include "stratagem/error.hpp"
#include "stratagem/version.hpp"

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
}
void set_collective_phase(bool on) {
  g_collective_phase = on;
}
bool collective_phase() {
  return g_collective_phase;
}

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
// Reports an error and ends the job. Before ranks work together every rank meets the same bad
// input: rank 0 prints it and all exit. Afterwards (or for an internal error) the failing rank
// prints it, prefixed with its rank, and aborts the job so that no peer waits for it forever.
void fail(const std::string& who, const char* kind, const char* what, int code,
          bool always_abort = false) {
  const int size = stratagem::cli::world_size();
  const bool abort = size > 1 && (always_abort || stratagem::cli::collective_phase());
  if (abort) {
    std::fprintf(stderr, "%s: %s on rank %d: %s\n", who.c_str(), kind, stratagem::cli::world_rank(),
                 what);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  } else if (stratagem::cli::world_rank() == 0) {
    std::fprintf(stderr, "%s: %s: %s\n", who.c_str(), kind, what);
  }
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    print_overview();
    return argc < 2 ? stratagem::kExitBadInput : 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::printf("stratagem %s\n", stratagem::kVersion);
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
    std::printf("%s", cmd->usage.c_str());
    return 0;
  }
  MPI_Init(&argc, &argv);
  int code = stratagem::kExitOk;
  const std::string who = "stratagem " + cmd->name;
  try {
    stratagem::cli::Args args("stratagem " + cmd->name, rest);
    code = cmd->run(args);
  } catch (const stratagem::InputError& e) {
    code = stratagem::kExitBadInput;
    fail(who, "error", e.what(), code);
  } catch (const stratagem::NotSupported& e) {
    code = stratagem::kExitBadInput;
    fail(who, "not supported yet", e.what(), code);
  } catch (const std::exception& e) {
    code = stratagem::kExitFailure;
    fail(who, "error", e.what(), code, /*always_abort=*/true);
  }
  MPI_Finalize();
  return code;
}
