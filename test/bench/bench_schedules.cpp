// `make bench`: the pipeline schedules in the search (issue 40). For each case, the best plan of
// the full space with the zero-bubble schedules (zb-h1, zb-h2, tried on the best 1F1B plans) and
// with 1F1B/interleaved only, both re-ranked by the simulator, their throughput and the ratio, and
// each search's wall time (goal: at most 5 s). Where the ratio is 1.00 the split did not win (or
// the model's layers cannot run it yet: MoE layers are refused, see plan_zero_bubble.cpp).
//
//   bench_schedules            every case
//   bench_schedules --case N   one case (0-based)
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

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
};

const Case kCases[] = {
    {"GPT-3 175B, 64 x A100-80GB, gbs 1536", "gpt3-175b", "dgx-a100-80g", 8, 1536},
    {"Llama-3-70B, 64 x H100, gbs 128", "llama3-70b", "dgx-h100", 8, 128},
    {"Mixtral-8x7B, 64 x H100, gbs 1024", "mixtral-8x7b", "dgx-h100", 8, 1024},
    {"DeepSeek-V3, 256 x 8 H800, gbs 15360", "deepseek-v3", "hgx-h800", 256, 15360},
};

struct Run {
  SearchResult result;
  double wall_s = 0;
};

Run run(const Case& k, bool zero_bubble) {
  const ModelSpec m = load_model(k.model);
  ClusterSpec c = load_cluster(k.cluster);
  c.nodes = k.nodes;
  SearchOptions o;
  o.global_batch = k.global_batch;
  if (!zero_bubble) o.schedules = {Schedule::gpipe, Schedule::one_f_one_b, Schedule::interleaved};
  const auto t0 = std::chrono::steady_clock::now();
  Run r;
  r.result = search(m, c, o);
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int only = -1;
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--case") && i + 1 < argc) only = std::atoi(argv[++i]);
  std::printf("%-40s %-14s %12s %8s  %s\n", "case", "schedules", "tokens/s", "search", "best plan");
  int n = 0;
  for (const Case& k : kCases) {
    if (only >= 0 && n++ != only) continue;
    try {
      const Run with = run(k, true), without = run(k, false);
      for (const auto& [label, r] : {std::pair{"with zb", &with}, {"1f1b/interl.", &without}})
        std::printf("%-40s %-14s %12.0f %7.2fs  %s\n", k.name, label, r->result.best.tokens_per_s(),
                    r->wall_s, r->result.best.plan.describe().c_str());
      std::printf("%-40s ratio %.3f (%s over 1F1B/interleaved only)\n", k.name,
                  with.result.best.tokens_per_s() / without.result.best.tokens_per_s(),
                  to_string(with.result.best.plan.schedule));
    } catch (const std::exception& e) {
      std::printf("%-40s error: %s\n", k.name, e.what());
    }
  }
  MPI_Finalize();
  return 0;
}
