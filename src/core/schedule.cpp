#include "stratagem/schedule.hpp"

#include <algorithm>

namespace stratagem {

int ScheduleShape::warmup_forwards(int s) const {
  switch (schedule) {
    case Schedule::gpipe:
      return chunk_passes();
    case Schedule::one_f_one_b:
      return std::min(pp - s - 1, chunk_passes());
    case Schedule::interleaved:
      return std::min((pp - s - 1) * 2 + (vpp - 1) * group_size(), chunk_passes());
    case Schedule::zb_h1:
    case Schedule::zb_h2:
      return std::min((pp - s - 1) * weight_lag(), chunk_passes());
  }
  return 0;
}

int ScheduleShape::deferred_weights(int s) const {
  return split() ? std::min(s * weight_lag(), chunk_passes()) : 0;
}

int ScheduleShape::passes_in_flight(int s) const {
  return std::min(warmup_forwards(s) + 1, chunk_passes());
}

// The forward passes run in groups: a whole group is `group_size()` micro-batches on chunk 0,
// then the same on chunk 1, ..., chunk vpp-1; the last group holds the micro-batches left.
int ScheduleShape::forward_chunk(int k) const {
  const int N = group_size(), whole = (microbatches / N) * period();
  if (k < whole) return (k % period()) / N;
  return (k - whole) / (microbatches - whole / vpp);
}

int ScheduleShape::forward_microbatch(int k) const {
  const int N = group_size(), whole = (microbatches / N) * period();
  if (k < whole) return (k / period()) * N + k % N;
  const int first = whole / vpp, left = microbatches - first;
  return first + (k - whole) % left;
}

int ScheduleShape::forwards_on_chunk(int n, int c) const {
  // Whole groups hold N on each chunk; then the partial one.
  const int N = group_size(), whole = (microbatches / N) * period();
  if (n <= whole) return (n / period()) * N + std::clamp(n % period() - c * N, 0, N);
  const int first = whole / vpp, left = microbatches - first;
  return first + std::clamp(n - whole - c * left, 0, left);
}

int interleaved_group(int pp, int microbatches) {
  for (int n = pp; n < microbatches; ++n)
    if (microbatches % n == 0 || microbatches % n >= pp) return n;
  return microbatches;
}

std::vector<PassStep> stage_schedule(const ScheduleShape& shape, int stage) {
  const int total = shape.chunk_passes(), warmup = shape.warmup_forwards(stage);
  std::vector<PassStep> out;
  out.reserve((shape.split() ? 3 : 2) * size_t(total));
  auto fwd = [&](int k) {
    out.push_back({true, shape.forward_chunk(k) * shape.pp + stage, shape.forward_microbatch(k)});
  };
  auto bwd = [&](int k) {
    out.push_back(
        {false, shape.backward_chunk(k) * shape.pp + stage, shape.backward_microbatch(k)});
  };
  int f = 0, b = 0;
  for (; f < warmup; ++f) fwd(f);
  if (shape.split()) {
    // W runs in micro-batch order, after its B; the first deferred_weights wait.
    auto weight = [&](int k) { out.push_back({false, stage, shape.backward_microbatch(k), true}); };
    const int held = shape.deferred_weights(stage);
    int w = 0;
    for (; b < total; ++b) {
      if (f < total) fwd(f++);
      bwd(b);
      if (b >= held) weight(w++);
    }
    while (w < total) weight(w++);
    return out;
  }
  while (f < total) fwd(f++), bwd(b++);
  while (b < total) bwd(b++);
  return out;
}

}  // namespace stratagem
