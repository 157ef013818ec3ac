// Deterministic GPT-2 style initialization from a counter-based RNG: every value is a pure
// function of (seed, tensor name, element index), so it is the same for any thread count and
// for any ModelPart (a pipeline stage or tensor-parallel share gets exactly the values of the
// full model's elements).
#include <cmath>
#include <numbers>
#include <string_view>
#include <vector>

#include "stratagem/transformer.hpp"

namespace stratagem {
namespace {

uint64_t mix64(uint64_t z) {  // splitmix64's finalizer: a bijective, well-mixing hash
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

double uniform_open(uint64_t bits) {  // (0,1), never 0 so log() is finite
  return (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;
}

// Standard normal number `i` of stream `key` (Box-Muller on counters 2i, 2i+1).
float normal(uint64_t key, uint64_t i) {
  const double u1 = uniform_open(mix64(key ^ mix64(2 * i)));
  const double u2 = uniform_open(mix64(key ^ mix64(2 * i + 1)));
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.ends_with(suffix);
}

}  // namespace

void init_parameters(Backend& be, const TransformerConfig& cfg, const ParamTable& table,
                     Tensor& flat, uint64_t seed) {
  if (flat.numel() < table.size())
    throw std::invalid_argument("init_parameters: buffer smaller than the parameter table");
  std::vector<float> host(static_cast<size_t>(table.size()));
  const float std_base = 0.02f;
  // GPT-2: the projections that write into the residual stream are scaled down so the
  // stream's variance does not grow with depth.
  const float std_resid = std_base / std::sqrt(2.0f * static_cast<float>(cfg.layers));
  for (const ParamInfo& e : table.entries()) {
    float* out = host.data() + e.offset;
    const int64_t n = e.numel();
    const std::string_view name = e.name;
    if (ends_with(name, ".bias")) {
      std::fill(out, out + n, 0.0f);
    } else if (ends_with(name, "norm.weight") || name == "norm_f.weight") {
      std::fill(out, out + n, 1.0f);
    } else {
      const float sd = (ends_with(name, "attn.proj.weight") || ends_with(name, ".fc2.weight"))
                           ? std_resid
                           : std_base;
      const uint64_t key = mix64(seed) ^ fnv1a(name);
      // Counted by the logical (whole-tensor) index: a tp share draws the whole model's values.
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = e.logical_index(i);
        out[i] = j < 0 ? 0.0f : sd * normal(key, static_cast<uint64_t>(j));
      }
    }
  }
  Tensor dst = flat.slice(0, Shape{table.size()});
  be.upload(dst, host.data());
}

}  // namespace stratagem
