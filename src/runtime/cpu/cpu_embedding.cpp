// Token (+ learned position) embedding, forward and backward.
#include <algorithm>

#include "cpu_backend.hpp"
#include "cpu_math.hpp"

namespace stratagem::cpu {
namespace {
// Channel chunk each thread owns in the backward scatter: every thread visits all tokens but
// writes only its own columns, so there are no races and the sum order is fixed.
constexpr int64_t kChannelChunk = 64;

}  // namespace

void CpuBackend::embedding_forward(Tensor& out, std::span<const int32_t> tokens, const Tensor& wte,
                                   const Tensor& wpe) {
  check_embedding_shapes("embedding_forward", out, wte, wpe);
  const int64_t B = out.dim(0), T = out.dim(1), C = out.dim(2);
  check_tokens("embedding_forward", tokens, B * T, wte.dim(0));
  const float* pos = wpe.data;
#pragma omp parallel for schedule(static) if (B * T * C >= kMinParallelWork)
  for (int64_t bt = 0; bt < B * T; ++bt) {
    float* o = out.data + bt * C;  // (C)
    if (tokens[bt] < 0) {          // another vocabulary shard's token
      if (pos)
        std::copy(pos + (bt % T) * C, pos + (bt % T + 1) * C, o);
      else
        std::fill(o, o + C, 0.0f);
      continue;
    }
    const float* w = wte.data + tokens[bt] * C;  // (C)
    if (pos) {
      const float* p = pos + (bt % T) * C;  // (C)
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = w[c] + p[c];
    } else {
      std::copy(w, w + C, o);
    }
  }
}

void CpuBackend::embedding_backward(Tensor& dwte, Tensor& dwpe, std::span<const int32_t> tokens,
                                    const Tensor& dout) {
  check_embedding_shapes("embedding_backward", dout, dwte, dwpe);
  const int64_t B = dout.dim(0), T = dout.dim(1), C = dout.dim(2);
  check_tokens("embedding_backward", tokens, B * T, dwte.dim(0));
  const int64_t chunks = (C + kChannelChunk - 1) / kChannelChunk;
  float* dpos = dwpe.data;
#pragma omp parallel for schedule(static) if (B * T * C >= kMinParallelWork)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t c0 = chunk * kChannelChunk, c1 = std::min(C, c0 + kChannelChunk);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const float* g = dout.data + bt * C;  // (C)
      if (tokens[bt] >= 0) {
        float* w = dwte.data + tokens[bt] * C;  // (C)
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) w[c] += g[c];
      }
      if (dpos) {
        float* p = dpos + (bt % T) * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) p[c] += g[c];
      }
    }
  }
}

}  // namespace stratagem::cpu
