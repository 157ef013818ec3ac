#include "src/interop/plan_shape.hpp"

#include <map>

namespace stratagem::interop::detail {

std::string runs(const Plan& p, const LayerKey& key) {
  std::string out;
  for (size_t i = 0; i < p.layers.size();) {
    size_t j = i;
    const std::string k = key(p.layers[i]);
    while (j + 1 < p.layers.size() && key(p.layers[j + 1]) == k) ++j;
    out += (out.empty() ? "" : ", ") + std::string(i == j ? "layer " : "layers ") +
           std::to_string(i) + (i == j ? "" : "-" + std::to_string(j)) + " " + k;
    i = j + 1;
  }
  return out;
}

bool uniform_by(const Plan& p, const LayerKey& key) {
  for (const auto& l : p.layers)
    if (key(l) != key(p.layers.front())) return false;
  return true;
}

const LayerStrategy& most_common(const Plan& p) {
  std::map<std::string, int> count;
  for (const auto& l : p.layers) count[l.describe()]++;
  const LayerStrategy* best = &p.layers.front();
  for (const auto& l : p.layers)
    if (count[l.describe()] > count[best->describe()]) best = &l;
  return *best;
}

int local_batch(const Plan& p) {
  return p.global_batch / p.max_dp();
}

std::optional<RecomputeShape> recompute_shape(const Plan& p) {
  if (uniform_by(p, [](const LayerStrategy& l) { return to_string(l.recompute); }))
    return RecomputeShape{p.layers.front().recompute, 0};
  // The block method: the same number of leading layers of every chunk fully recomputed, the
  // rest not (a chunk shorter than the block is recomputed whole).
  int n = -1;
  for (const auto& c : p.chunks) {
    int k = 0;
    while (c.begin + k < c.end && p.layers[c.begin + k].recompute == Recompute::full) ++k;
    if (k == c.size()) continue;
    if (n >= 0 && k != n) return std::nullopt;
    n = k;
  }
  if (n <= 0) return std::nullopt;
  for (const auto& c : p.chunks)
    for (int i = c.begin; i < c.end; ++i)
      if (p.layers[i].recompute != (i - c.begin < n ? Recompute::full : Recompute::none))
        return std::nullopt;
  return RecomputeShape{Recompute::full, n};
}

std::optional<FirstLast> first_last_split(const Plan& p) {
  if (p.chunks.size() != size_t(p.pp)) return std::nullopt;
  const auto even = even_chunks(p.chunks.back().end, p.pp);
  if (p.chunks == even && chunks_equal(p)) return FirstLast{};
  if (p.pp < 2) return std::nullopt;
  const int middle = p.pp > 2 ? p.chunks[1].size() : 0;
  for (int s = 1; s + 1 < p.pp; ++s)
    if (p.chunks[s].size() != middle) return std::nullopt;
  return FirstLast{p.chunks.front().size(), p.chunks.back().size()};
}

bool chunks_equal(const Plan& p) {
  for (const auto& c : p.chunks)
    if (c.size() != p.chunks.front().size()) return false;
  return true;
}

}  // namespace stratagem::interop::detail
