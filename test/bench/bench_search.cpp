// `make bench`: the strategy search on the cases. Per case: search time (DP + estimator
// phase, simulator re-rank, total), candidates evaluated, and the forecast throughput of the best
// plan against the best Megatron-style and ZeRO-3 plans (same scorer: the simulator). Goal: the
// search phase under 10 s per case on one core. Then the MPI speedup: the estimator-ranked search
// of every case at -np 1 (this process) and -np 2 (mpirun of this binary), goal >= 1.7x.
//
//   bench_search                 everything (the -np 2 half through STRATAGEM_MPIEXEC)
//   bench_search --no-simulate   skip the simulator re-rank
//   bench_search --no-mpi        skip the speedup measurement
//   bench_search --case N        one case (0-based)
//   bench_search --no-memory-bound   skip the memory-bound table
//
// The memory-bound table: the seed papers' settings where memory is tight (Galvatron-BMW's
// BERT-Huge-32 on 8 GPUs at 8 and 12 GiB; H3T's 6B on 8 x 2080 Ti (11 GB) scaled to GPT-3 6.7B
// on 8 A100 with an 11 GiB budget, its 13B on 8 A100 and its 175B case on 32 A100-40GB):
// the searched plan against the best uniform Megatron-style plan and the best uniform ZeRO-3
// plan, all scored by the simulator. The searched plan must never be below either.
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "stratagem/framework.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/search.hpp"

using namespace stratagem;

namespace {

struct Case {
  const char* name;
  const char* model;
  const char* cluster;
  int nodes;
  int global_batch;
  double budget_gib;  // 0: the GPU's memory
};

// The cases. BERT-Huge-32 as in Galvatron (Miao et al., VLDB 2023): 8 A100-40GB, memory
// budgets of 8, 12 and 16 GiB; global batch 64 (8 samples per GPU at full data parallelism).
// LLaMA-2-70B: 1024 x 4096 tokens, its pretraining batch of 4M tokens.
const Case kCases[] = {
    {"GPT-3 175B, 64 x A100-80GB", "gpt3-175b", "dgx-a100-80g", 8, 1536, 0},
    {"GPT-3 175B, 1024 x A100-80GB", "gpt3-175b", "dgx-a100-80g", 128, 1536, 0},
    {"LLaMA-2-70B, 64 x A100-80GB", "llama2-70b", "dgx-a100-80g", 8, 1024, 0},
    {"BERT-Huge-32, 8 x A100-40GB, 8 GiB", "bert-huge-32", "dgx-a100-40g", 1, 64, 8},
    {"BERT-Huge-32, 8 x A100-40GB, 12 GiB", "bert-huge-32", "dgx-a100-40g", 1, 64, 12},
    {"BERT-Huge-32, 8 x A100-40GB, 16 GiB", "bert-huge-32", "dgx-a100-40g", 1, 64, 16},
    // Issue #26: Mixture-of-Experts; the best plan beside the best uniform plan with ep 1.
    {"Mixtral 8x7B (MoE), 64 x H100", "mixtral-8x7b", "dgx-h100", 8, 1024, 0},
};
constexpr int kNumCases = int(sizeof(kCases) / sizeof(kCases[0]));

struct MemoryBoundCase {
  Case c;
  const char* source;
};
const MemoryBoundCase kMemoryBound[] = {
    {{"BERT-Huge-32, 8 x A100-40GB, 8 GiB", "bert-huge-32", "dgx-a100-40g", 1, 64, 8},
     "Galvatron-BMW"},
    {{"BERT-Huge-32, 8 x A100-40GB, 12 GiB", "bert-huge-32", "dgx-a100-40g", 1, 64, 12},
     "Galvatron-BMW"},
    {{"GPT-3 6.7B, 8 x A100-40GB, 11 GiB", "gpt3-6.7b", "dgx-a100-40g", 1, 128, 11},
     "H3T 6B/2080Ti"},
    {{"GPT-3 13B, 8 x A100-40GB", "gpt3-13b", "dgx-a100-40g", 1, 128, 0}, "H3T 13B/A100"},
    {{"GPT-3 175B, 32 x A100-40GB", "gpt3-175b", "dgx-a100-40g", 4, 256, 0}, "H3T 175B"},
};

struct Loaded {
  ModelSpec model;
  ClusterSpec cluster;
  SearchOptions options;
};

Loaded load(const Case& c, bool simulate, MPI_Comm comm) {
  Loaded l{load_model(c.model), load_cluster(c.cluster), {}};
  l.cluster.nodes = c.nodes;
  l.options.global_batch = c.global_batch;
  l.options.memory_budget_bytes = static_cast<int64_t>(c.budget_gib * double(int64_t(1) << 30));
  l.options.rerank_with_simulator = simulate;
  l.options.comm = comm;
  // As `stratagem search` prices plans by default (--framework stratagem), so that the goal line
  // measures the command the goal names.
  l.options.framework = load_framework("stratagem");
  return l;
}

double ratio(double a, const std::optional<SearchCandidate>& b) {
  return b && b->tokens_per_s() > 0 ? a / b->tokens_per_s() : 0.0;
}

void report(const Case& c, const SearchResult& r) {
  const SearchStats& s = r.stats;
  std::printf("\n%s, global batch %d, budget %.0f GiB\n", c.name, c.global_batch,
              double(r.memory_budget_bytes) / double(int64_t(1) << 30));
  std::printf(
      "  search %.2f s (DP + estimator %.2f s%s, re-rank by the %s %.2f s after it and %.2f s "
      "of %lld simulations beside it); %lld candidates evaluated, %lld simulated; %lld of %lld "
      "configurations searched (%lld pruned by the bound)\n",
      s.search_time_s, s.estimate_phase_s,
      s.estimate_phase_s < 10 ? ", goal < 10 s met" : ", ABOVE the 10 s goal", r.scorer.c_str(),
      s.rerank_phase_s, s.rerank_overlapped_s, (long long)s.plans_simulated_overlapped,
      (long long)s.candidates_evaluated, (long long)s.plans_simulated,
      (long long)s.configs_searched, (long long)s.configs, (long long)s.configs_pruned);
  std::printf("  best      %10.0f tokens/s (estimator %10.0f), peak %5.1f GiB: %s\n",
              r.best.tokens_per_s(), r.best.est_tokens_per_s,
              double(r.best.peak_memory_bytes()) / double(int64_t(1) << 30),
              r.best.plan.describe().c_str());
  auto base = [&](const char* name, const std::optional<SearchCandidate>& b,
                  const std::string& note) {
    if (!b) {
      std::printf("  %-9s none (%s)\n", name, note.c_str());
      return;
    }
    std::printf("  %-9s %10.0f tokens/s (estimator %10.0f): search is %.2fx; %s\n", name,
                b->tokens_per_s(), b->est_tokens_per_s, ratio(r.best.tokens_per_s(), b),
                b->plan.describe().c_str());
  };
  base("megatron", r.megatron, r.megatron_note);
  base("zero-3", r.zero, r.zero_note);
  // An MoE model: the megatron baseline is the best uniform plan without expert parallelism.
  int ep = 1;
  for (const auto& l : r.best.plan.layers) ep = std::max(ep, l.ep);
  if (r.megatron && load_model(c.model).moe.enabled())
    std::printf("  MoE: best plan ep %d, %.2fx the best uniform plan with ep 1 (megatron above)\n",
                ep, ratio(r.best.tokens_per_s(), r.megatron));
}

// Prints the table; returns false when the searched plan is below a baseline.
bool memory_bound_table() {
  std::printf(
      "\nmemory-bound cases (seed papers' settings; tokens/s by the simulator, one process)\n");
  std::printf("  %-38s %-14s %10s %10s %6s %10s %6s  %s\n", "case", "setting from", "searched",
              "megatron", "x", "zero-3", "x", "note");
  bool ok = true;
  for (const auto& mb : kMemoryBound) {
    Loaded l = load(mb.c, true, MPI_COMM_NULL);
    const SearchResult r = search(l.model, l.cluster, l.options);
    const double best = r.best.tokens_per_s();
    auto cell = [&](const std::optional<SearchCandidate>& b, double* x) {
      *x = ratio(best, b);
      return b ? b->tokens_per_s() : 0.0;
    };
    double xm = 0, xz = 0;
    const double tm = cell(r.megatron, &xm), tz = cell(r.zero, &xz);
    std::string note;
    const bool below = (r.megatron && xm < 1 - 1e-12) || (r.zero && xz < 1 - 1e-12);
    if (below) {
      note = "BELOW A BASELINE";
      ok = false;
    } else if ((!r.megatron || xm > 1 + 1e-9) && (!r.zero || xz > 1 + 1e-9)) {
      note = "above both (" + std::string(r.best.origin) + ")";
    } else {
      note = "ties: the best plan is the uniform " + std::string(r.best.origin) +
             " baseline itself; every per-layer mix the search scored was slower";
    }
    if (!r.megatron) note += "; megatron: " + r.megatron_note;
    if (!r.zero) note += "; zero-3: " + r.zero_note;
    std::printf("  %-38s %-14s %10.0f %10.0f %6.2f %10.0f %6.2f  %s\n", mb.c.name, mb.source, best,
                tm, xm, tz, xz, note.c_str());
    std::printf("  %-38s searched: %s (%.1f s)\n", "", r.best.plan.describe().c_str(),
                r.stats.search_time_s);
    std::fflush(stdout);
  }
  return ok;
}

// The estimator-ranked search of the cases (the work MPI splits); on rank 0 prints
// "time <case> <seconds> <best key length>:<best tokens/s>" lines for the parent to parse.
std::vector<double> timed_searches(const std::vector<int>& which, MPI_Comm comm,
                                   std::vector<std::string>* keys) {
  std::vector<double> out;
  for (int i : which) {
    Loaded l = load(kCases[i], false, comm);
    if (comm != MPI_COMM_NULL) MPI_Barrier(comm);
    const auto t0 = std::chrono::steady_clock::now();
    SearchResult r = search(l.model, l.cluster, l.options);
    out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (keys) keys->push_back(r.best.key);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // Only the -np 2 child initializes MPI: the parent launches mpirun, which must not inherit an
  // MPI environment, and searches with no communicator (one process).
  bool simulate = true, mpi = true, child = false, memory_bound = true;
  std::vector<int> which;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--no-simulate"))
      simulate = false;
    else if (!std::strcmp(argv[i], "--no-mpi"))
      mpi = false;
    else if (!std::strcmp(argv[i], "--no-memory-bound"))
      memory_bound = false;
    else if (!std::strcmp(argv[i], "--child"))
      child = true;
    else if (!std::strcmp(argv[i], "--case") && i + 1 < argc)
      which.push_back(std::atoi(argv[++i]));
  }
  if (which.empty())
    for (int i = 0; i < kNumCases; ++i) which.push_back(i);

  if (child) {
    // Under mpirun: every process searches, rank 0 reports.
    MPI_Init(&argc, &argv);
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::vector<std::string> keys;
    const auto t = timed_searches(which, MPI_COMM_WORLD, &keys);
    if (rank == 0)
      for (size_t k = 0; k < which.size(); ++k)
        std::printf("time %d %.6f %s\n", which[k], t[k], keys[k].c_str());
    MPI_Finalize();
    return 0;
  }
  if (std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE")) {
    std::fprintf(stderr, "bench_search: run it without mpirun (it launches -np 2 itself)\n");
    return 1;
  }

  std::printf(
      "strategy search benchmarks (one process; the re-rank simulates on up to %ld threads)\n",
      sysconf(_SC_NPROCESSORS_ONLN));
  auto cpu_s = [] {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
  };
  for (int i : which) {
    Loaded l = load(kCases[i], simulate, MPI_COMM_NULL);
    const double cpu0 = cpu_s();
    const SearchResult r = search(l.model, l.cluster, l.options);
    const double cpu = cpu_s() - cpu0;
    report(kCases[i], r);
    // The process's peak resident memory so far (the first case runs first: its own peak).
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    const double rss_mb = double(ru.ru_maxrss) / 1024.0;
    if (i == 0 && simulate)
      std::printf(
          "  goal (GPT-3 175B / 64 A100, re-rank included): <= 5 s: %.2f s wall %s (%.2f s of "
          "CPU, user + system, all threads; wall time depends on what else runs on this "
          "host); <= 500 MB resident: %.0f MB %s\n",
          r.stats.search_time_s, r.stats.search_time_s <= 5 ? "OK" : "NOT MET", cpu, rss_mb,
          rss_mb <= 500 ? "OK" : "NOT MET");
    else
      std::printf("  %.2f s of CPU; peak resident memory of this process so far: %.0f MB\n", cpu,
                  rss_mb);
    std::fflush(stdout);
  }

  int status = 0;
  if (memory_bound && simulate && !memory_bound_table()) status = 1;
  if (mpi) {
    std::printf(
        "\nMPI speedup of the search (estimator ranking; -np 1 in this process, -np 2 by %s)\n",
        STRATAGEM_MPIEXEC);
    std::vector<std::string> keys1;
    const auto t1 = timed_searches(which, MPI_COMM_NULL, &keys1);
    std::string cmd = std::string(STRATAGEM_MPIEXEC) + " -np 2 " + argv[0] + " --child";
    for (int i : which) cmd += " --case " + std::to_string(i);
    std::map<int, std::pair<double, std::string>> t2;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char line[65536];
      while (std::fgets(line, sizeof line, p)) {
        int c = -1;
        double sec = 0;
        int used = 0;
        if (std::sscanf(line, "time %d %lf %n", &c, &sec, &used) == 2) {
          std::string key(line + used);
          while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) key.pop_back();
          t2[c] = {sec, key};
        }
      }
      ::pclose(p);
    }
    double sum1 = 0, sum2 = 0;
    for (size_t k = 0; k < which.size(); ++k) {
      const int i = which[k];
      if (!t2.count(i)) {
        std::printf("  %-38s -np 1 %6.2f s   -np 2: no result\n", kCases[i].name, t1[k]);
        status = 1;
        continue;
      }
      const bool same = t2[i].second == keys1[k];
      std::printf("  %-38s -np 1 %6.2f s   -np 2 %6.2f s   speedup %.2fx   same best plan: %s\n",
                  kCases[i].name, t1[k], t2[i].first, t1[k] / t2[i].first, same ? "yes" : "NO");
      if (!same) status = 1;
      sum1 += t1[k], sum2 += t2[i].first;
    }
    if (sum2 > 0)
      std::printf(
          "  all cases: -np 1 %.2f s, -np 2 %.2f s, speedup %.2fx (goal >= 1.7x; this host has %ld "
          "cores, shared)\n",
          sum1, sum2, sum1 / sum2, sysconf(_SC_NPROCESSORS_ONLN));
  }
  return status;
}
