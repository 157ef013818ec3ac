#include "src/core/schedule.hpp"

#include <algorithm>

namespace stratagem {

std::vector<PassStep> stage_schedule(const Plan& plan, int stage, int M) {
  const int p = plan.pp;
  std::vector<PassStep> out;
  if (plan.schedule == Schedule::gpipe) {
    for (int k = 0; k < M; ++k) out.push_back({true, stage, k});
    for (int k = M - 1; k >= 0; --k) out.push_back({false, stage, k});
    return out;
  }
  if (plan.schedule == Schedule::one_f_one_b) {
    const int warmup = std::min(p - stage - 1, M);
    int f = 0, b = 0;
    for (; f < warmup; ++f) out.push_back({true, stage, f});
    while (f < M) {
      out.push_back({true, stage, f++});
      out.push_back({false, stage, b++});
    }
    while (b < M) out.push_back({false, stage, b++});
    return out;
  }
  // Interleaved (Narayanan et al. 2021): micro-batches advance in groups of p through the
  // stage's vpp chunks; backward walks the chunks in reverse.
  const int v = plan.vpp, total = M * v;
  auto fwd = [&](int k) {
    int chunk_local = (k % (p * v)) / p;
    int mb = (k / (p * v)) * p + k % p;
    return PassStep{true, chunk_local * p + stage, mb};
  };
  auto bwd = [&](int k) {
    int chunk_local = v - 1 - (k % (p * v)) / p;
    int mb = (k / (p * v)) * p + k % p;
    return PassStep{false, chunk_local * p + stage, mb};
  };
  const int warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  int f = 0, b = 0;
  for (; f < warmup; ++f) out.push_back(fwd(f));
  while (f < total) {
    out.push_back(fwd(f++));
    out.push_back(bwd(b++));
  }
  while (b < total) out.push_back(bwd(b++));
  return out;
}

}  // namespace stratagem
