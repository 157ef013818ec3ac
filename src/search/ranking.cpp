// How the search scores and orders plans (searcher.hpp: time_rank, ranks_before, score).
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <set>

#include "src/search/searcher.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/estimate.hpp"

namespace stratagem::search_detail {

double time_rank(double t) {
  if (!std::isfinite(t) || t == 0) return t;
  int e = 0;
  const double m = std::frexp(t, &e);  // t = m 2^e, 0.5 <= |m| < 1
  return std::ldexp(std::nearbyint(std::ldexp(m, 30)), e - 30);
}

bool ranks_before(double time_a, int64_t peak_a, const std::string& key_a, double time_b,
                  int64_t peak_b, const std::string& key_b) {
  const double ra = time_rank(time_a), rb = time_rank(time_b);
  if (ra != rb) return ra < rb;
  if (peak_a != peak_b) return peak_a < peak_b;
  return key_a < key_b;
}

std::vector<SearchCandidate> distinct_candidates(const std::vector<const TopK*>& pools) {
  std::vector<SearchCandidate> out;
  std::set<std::string> keys;
  for (const TopK* t : pools)
    for (const auto& c : t->items())
      if (keys.insert(c.key).second) out.push_back(c);
  return out;
}

double gib(int64_t b) {
  return double(b) / double(int64_t(1) << 30);
}
std::string fmt_gib(int64_t b) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f GiB", gib(b));
  return buf;
}

Scored score(const ModelSpec& m, const ClusterSpec& c, const Plan& p, const FrameworkSpec& fw) {
  CostModel cm(m, c, p.dtype, fw);
  Estimate e = estimate(cm, p);
  Scored s;
  s.time = e.iteration_time_s;
  s.tokens = e.tokens_per_s;
  s.peak = e.peak_memory_bytes;
  const double frag = 1.0 + c.gpu.allocator_fragmentation;
  for (const auto& st : e.stages) {
    s.stage_peaks.push_back(st.peak_memory_bytes);
    s.stage_net_bytes.push_back(st.memory.tensor_bytes() +
                                int64_t(double(st.memory.nccl_buffers_bytes) / frag));
  }
  return s;
}

SearchCandidate make_candidate(const Plan& p, const Scored& s, const char* origin) {
  SearchCandidate c;
  c.plan = p;
  c.key = to_json(p).dump();
  c.origin = origin;
  c.est_iteration_time_s = s.time;
  c.est_tokens_per_s = s.tokens;
  c.est_peak_memory_bytes = s.peak;
  c.est_stage_peak_bytes = s.stage_peaks;
  return c;
}

}  // namespace stratagem::search_detail
