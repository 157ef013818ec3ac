// Up-front memory estimate of a simulation, so that a job too large for the machine is refused
// with its size instead of dying in std::bad_alloc halfway through setup.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "sim/rank_state.hpp"
#include "stratagem/simulate.hpp"
#include "stratagem/trace.hpp"

namespace stratagem {

int64_t simulation_footprint_bytes(const Program& program, int world_size,
                                   const SimOptions& options) {
  // Per simulated rank: its state, its result (twice while results are gathered), and about
  // 1 KiB for its group row, network resources, partition entry and layout coordinates.
  // Measured on gpt2-124m plans with dp = world (RSS less the 200 MB of a 80,000-rank run):
  // 2.3 KiB per rank at 400,000 ranks; this formula gives 2.2 KiB.
  const int64_t per_rank =
      int64_t(sizeof(sim::RankState)) + 2 * int64_t(sizeof(SimRankResult)) + 1024;
  int64_t bytes = int64_t(world_size) * per_rank;
  if (options.record_trace) {
    size_t ops = 0;
    for (const auto& s : program.stages) ops = std::max(ops, s.ops.size());
    // Every op of every iteration as a span, alloc/free ops also as a memory sample.
    const int64_t per_op = int64_t(sizeof(SimOpSpan) + sizeof(trace::MemorySample));
    bytes += int64_t(world_size) * int64_t(ops) * std::max(1, options.iterations) * per_op;
  }
  return bytes;
}

int64_t memory_limit_bytes(std::string* limited_by) {
  int64_t limit = int64_t(sysconf(_SC_PHYS_PAGES)) * int64_t(sysconf(_SC_PAGE_SIZE));
  std::string by = "physical memory";
  auto lower = [&](int64_t v, const char* name) {
    if (v > 0 && v < limit) limit = v, by = name;
  };
  for (auto [res, name] :
       {std::pair{RLIMIT_AS, "ulimit -v"}, std::pair{RLIMIT_DATA, "ulimit -d"}}) {
    rlimit rl{};
    if (getrlimit(res, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
      lower(int64_t(std::min<rlim_t>(rl.rlim_cur, rlim_t(INT64_MAX))), name);
  }
  std::ifstream cg("/sys/fs/cgroup/memory.max");
  std::string v;
  if (cg >> v && v != "max") lower(std::atoll(v.c_str()), "the cgroup's memory.max");
  if (limited_by) *limited_by = by;
  return limit;
}

}  // namespace stratagem
