// `make bench`: estimator calls per second on GPT-3 175B plans (goal, issue 15: >= 250,000 on one
// core).
#include <chrono>
#include <cstdio>
#include <vector>

#include "stratagem/cost.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/loaders.hpp"

using namespace stratagem;

int main() {
  const ModelSpec m = load_model("gpt3-175b");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 128;
  // A spread of the plans a search visits: tp, pp, schedule, recompute, sp, ZeRO.
  std::vector<Plan> plans;
  for (int tp : {2, 4, 8})
    for (int pp : {4, 8, 16})
      for (const char* rc : {"none", "selective", "full"})
        for (int z : {0, 1})
          for (int vpp : {1, 2}) {
            PlanShorthand s;
            s.tp = tp, s.pp = pp, s.micro_batch = 1, s.global_batch = 1536, s.recompute = rc;
            s.zero = z, s.sequence_parallel = tp > 1, s.vpp = vpp;
            Plan p = expand_shorthand(s, m, c);
            try {
              validate(p, m, c, "bench");
            } catch (const std::exception&) {
              continue;
            }
            plans.push_back(std::move(p));
          }
  // The search builds one CostModel per candidate plan and estimates it: time both.
  double sink = 0;
  long calls = 0;
  auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  while (elapsed < 2.0) {
    for (const Plan& p : plans) {
      CostModel cost(m, c, p.dtype);
      sink += estimate(cost, p).iteration_time_s;
    }
    calls += long(plans.size());
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::printf("estimate(): %zu GPT-3 175B plans on %d GPUs, %ld calls in %.2f s\n", plans.size(),
              c.world_size(), calls, elapsed);
  std::printf("estimator calls per second (one core, CostModel construction included): %.0f\n",
              calls / elapsed);
  std::printf("  %s (goal >= 250000)\n",
              calls / elapsed >= 2.5e5 ? "meets the goal" : "BELOW the goal");
  return sink > 0 ? 0 : 1;
}
