// The bounded record of evaluated plans (see evaluated.hpp).
#include "src/search/evaluated.hpp"

#include <algorithm>
#include <cstring>

namespace stratagem::search_detail {

uint64_t EvaluatedLog::hash_of(double time_s, double tokens, int64_t peak) {
  // splitmix64 over the figures' bits: a deterministic, well-mixed key for the uniform sample.
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  uint64_t a = 0, b = 0;
  std::memcpy(&a, &time_s, sizeof a);
  std::memcpy(&b, &tokens, sizeof b);
  return mix(mix(mix(a) ^ b) ^ uint64_t(peak));
}

// True when no recorded plan of at most this peak reaches this throughput.
bool EvaluatedLog::on_front(int64_t peak, double tokens) const {
  auto it = front_.upper_bound(peak);
  if (it == front_.begin()) return true;
  return std::prev(it)->second.tokens_per_s < tokens;
}

void EvaluatedLog::add_to_front(const EvaluatedPlan& e) {
  // Drop the plans the new one dominates: at least its peak, at most its throughput.
  auto it = front_.lower_bound(e.peak_memory_bytes);
  while (it != front_.end() && it->second.tokens_per_s <= e.tokens_per_s) it = front_.erase(it);
  front_[e.peak_memory_bytes] = e;
}

void EvaluatedLog::record(const Plan& p, double iteration_time_s, double tokens_per_s,
                          int64_t peak_bytes, const char* origin) {
  const uint64_t h = hash_of(iteration_time_s, tokens_per_s, peak_bytes);
  const bool sample = (int(sample_.size()) < kEvaluatedSampleCap || h < sample_.rbegin()->first) &&
                      !sample_.count(h);
  const bool front = on_front(peak_bytes, tokens_per_s);
  if (!sample && !front) return;
  EvaluatedPlan e;
  e.tokens_per_s = tokens_per_s;
  e.iteration_time_s = iteration_time_s;
  e.peak_memory_bytes = peak_bytes;
  e.origin = origin;
  e.description = p.describe();
  e.hash = h;
  record(e);
}

void EvaluatedLog::record(const EvaluatedPlan& e) {
  if (!sample_.count(e.hash) &&
      (int(sample_.size()) < kEvaluatedSampleCap || e.hash < sample_.rbegin()->first)) {
    sample_[e.hash] = e;
    if (int(sample_.size()) > kEvaluatedSampleCap) sample_.erase(std::prev(sample_.end()));
  }
  if (on_front(e.peak_memory_bytes, e.tokens_per_s)) add_to_front(e);
}

std::vector<EvaluatedPlan> EvaluatedLog::plans() const {
  std::map<uint64_t, EvaluatedPlan> all = sample_;
  for (const auto& [peak, e] : front_) {
    (void)peak;
    all[e.hash] = e;
  }
  std::vector<EvaluatedPlan> out;
  out.reserve(all.size());
  for (auto& [h, e] : all) {
    (void)h;
    out.push_back(e);
    out.back().pareto = false;
  }
  for (auto& e : out) {
    auto it = front_.find(e.peak_memory_bytes);
    e.pareto = it != front_.end() && it->second.hash == e.hash;
  }
  std::sort(out.begin(), out.end(), [](const EvaluatedPlan& a, const EvaluatedPlan& b) {
    if (a.peak_memory_bytes != b.peak_memory_bytes)
      return a.peak_memory_bytes < b.peak_memory_bytes;
    if (a.tokens_per_s != b.tokens_per_s) return a.tokens_per_s > b.tokens_per_s;
    return a.hash < b.hash;
  });
  return out;
}

}  // namespace stratagem::search_detail
