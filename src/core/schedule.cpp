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
      return std::min((pp - s - 1) * 2 + (vpp - 1) * pp, chunk_passes());
  }
  return 0;
}

int ScheduleShape::passes_in_flight(int s) const {
  return std::min(warmup_forwards(s) + 1, chunk_passes());
}

int ScheduleShape::forwards_on_chunk(int n, int c) const {
  // Whole periods of pp * vpp forwards hold pp on each chunk; then the partial one.
  return (n / period()) * pp + std::clamp(n % period() - c * pp, 0, pp);
}

std::vector<PassStep> stage_schedule(const ScheduleShape& shape, int stage) {
  const int total = shape.chunk_passes(), warmup = shape.warmup_forwards(stage);
  std::vector<PassStep> out;
  out.reserve(2 * size_t(total));
  auto fwd = [&](int k) {
    out.push_back({true, shape.forward_chunk(k) * shape.pp + stage, shape.forward_microbatch(k)});
  };
  auto bwd = [&](int k) {
    out.push_back(
        {false, shape.backward_chunk(k) * shape.pp + stage, shape.backward_microbatch(k)});
  };
  int f = 0, b = 0;
  for (; f < warmup; ++f) fwd(f);
  while (f < total) fwd(f++), bwd(b++);
  while (b < total) bwd(b++);
  return out;
}

}  // namespace stratagem
