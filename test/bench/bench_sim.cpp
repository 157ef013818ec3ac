// Simulator benchmark (`make bench`): events per second of the event loop, the wall time to
// simulate one iteration of GPT-3 175B on 1024 A100 (tp 8, pp 16, dp 8, 1F1B, 1536 x 2048
// tokens; goal < 2 s on one core), and the speedup of the MPI-parallel simulation at -np 2.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "stratagem/cost.hpp"
#include "stratagem/simulate.hpp"

using namespace stratagem;
using clk = std::chrono::steady_clock;

namespace {

double seconds_since(clk::time_point t) {
  return std::chrono::duration<double>(clk::now() - t).count();
}

}  // namespace

int main() {
  const ModelSpec m = load_model("gpt3-175b");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 128;
  PlanShorthand sh;
  sh.tp = 8, sh.pp = 16, sh.dp = 8, sh.micro_batch = 1, sh.global_batch = 1536;
  sh.schedule = std::string("1f1b");
  const Plan p = expand_shorthand(sh, m, c);
  validate(p, m, c, "bench");

  // In-process, one core: program generation, cost model, simulation.
  double best_total = -1, best_run = 0, best_setup = 0;
  SimResult r;
  double build_s = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = clk::now();
    const Layout L(p, c);
    const Program prog = build_program(m, p);
    const CostModel cost(m, c, p);
    const CostModelCosts costs(cost);
    const double b = seconds_since(t0);
    r = simulate(prog, L, c, costs, {});
    const double total = seconds_since(t0);
    if (best_total < 0 || total < best_total)
      best_total = total, best_run = r.stats.run_s, best_setup = r.stats.setup_s, build_s = b;
  }
  std::printf(
      "GPT-3 175B, 1024 x A100-80GB (tp8 pp16 dp8, 1F1B, 192 micro-batches), one iteration:\n");
  std::printf("  simulated iteration time      %.4f s\n", double(r.makespan_ns) * 1e-9);
  std::printf("  op events (all ranks)          %llu\n", (unsigned long long)r.stats.ops_executed);
  std::printf("  queue events                   %llu\n", (unsigned long long)r.stats.heap_events);
  std::printf("  wall: program+cost model %.3f s, simulator setup %.3f s, event loop %.3f s\n",
              build_s, best_setup, best_run);
  std::printf("  wall time, one core            %.3f s  (goal < 2 s) %s\n", best_total,
              best_total < 2 ? "OK" : "SLOWER THAN GOAL");
  std::printf("  op events per second           %.3g (event loop), %.3g (end to end)\n",
              double(r.stats.ops_executed) / best_run, double(r.stats.ops_executed) / best_total);
  std::printf("  queue events per second        %.3g\n", double(r.stats.heap_events) / best_run);

  // The CLI at -np 1 and -np 2 (the same JSON). "simulator" is what the simulator reports for
  // itself (setup + event loop on process 0), "CLI" includes process and MPI start-up.
  const char* env = std::getenv("STRATAGEM_BIN");
  const std::string bin = env ? env : STRATAGEM_BIN;
  const std::string args =
      " simulate --model gpt3-175b --cluster dgx-a100-80g --nodes 128 --tp 8 --pp 16 --dp 8 "
      "--micro-batch 1 --global-batch 1536";
  double sim[2] = {-1, -1}, cli[2] = {-1, -1};
  for (int k = 0; k < 2; ++k) {
    const std::string cmd =
        (k ? std::string(STRATAGEM_MPIEXEC_CMD) + " -np 2 " : std::string()) + bin + args;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t = clk::now();
      std::FILE* f = popen((cmd + " 2>/dev/null </dev/null").c_str(), "r");
      if (!f) break;
      char line[512];
      double s = -1;
      while (std::fgets(line, sizeof line, f)) {
        unsigned long long n;
        double x;
        if (std::sscanf(line, "simulated %llu op events in %lf s", &n, &x) == 2) s = x;
      }
      const int rc = pclose(f);
      const double w = seconds_since(t);
      if (rc != 0 || s < 0) break;
      if (sim[k] < 0 || s < sim[k]) sim[k] = s;
      if (cli[k] < 0 || w < cli[k]) cli[k] = w;
    }
  }
  if (sim[0] < 0 || sim[1] < 0) {
    std::printf("  mpirun -np 2: could not run %s\n", bin.c_str());
    return 1;
  }
  std::printf(
      "  mpirun -np 2 speedup           %.2fx simulator (%.3f s -> %.3f s), %.2fx CLI (%.3f s -> "
      "%.3f s)\n",
      sim[0] / sim[1], sim[0], sim[1], cli[0] / cli[1], cli[0], cli[1]);
  return 0;
}
