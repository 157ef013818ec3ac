// Seeded normal samples and a backend tensor holding them, for kernel tests.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "stratagem/backend.hpp"

namespace stratagem::test {

inline std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A tensor of `be` holding `v` (v.size() == s.numel()).
inline Tensor host(Backend& be, const std::vector<float>& v, Shape s) {
  Tensor t = be.allocate(s);
  be.upload(t, v.data());
  return t;
}

}  // namespace stratagem::test
