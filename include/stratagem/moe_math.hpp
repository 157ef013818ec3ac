// The host math of the Mixture-of-Experts kernels (router scoring and top-k, the load-balancing
// loss, the row gathers of the permutation and the weighted combine), over plain fp32 arrays.
// The CPU backend calls these on its tensors directly; any other backend runs them through the
// Backend's default bodies (backend.hpp), which stage the operands through host memory. The
// work is O(tokens x experts) or O(tokens x top_k x hidden), small beside the experts' GEMMs,
// and the routing decisions must reach the host anyway: the dispatch's all-to-all counts are
// built from them.
//
// Formulas (the sources are Megatron-Core's moe_utils.py / router.py, Mixtral, DeepSeek-V3):
//  - scores s = softmax(logits) over the experts, or sigmoid(logits) per expert;
//  - top-k by score, ties to the lower expert index, in decreasing score order;
//  - combine weights w = s_sel / sum(s_sel) when K > 1 (for softmax this is Mixtral's softmax
//    over the top-k logits, for sigmoid DeepSeek-V3's normalisation), w = s_sel when K == 1
//    (Switch Transformer);
//  - the load-balancing loss (Switch / Megatron-Core switch_load_balancing_loss_func):
//      aux = coeff * E * sum_i f_i * P_i,  f_i = (copies routed to i) / (N*K),
//      P_i = mean over tokens of p[n,i], p = s (softmax) or s / sum_e s (sigmoid);
//    f_i counts are not differentiated (they come from the top-k), P_i is.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "stratagem/model.hpp"  // RouterScore

namespace stratagem::moe_math {

// Copies routed to each expert: experts (N*K) ids in [0,E).
inline std::vector<int64_t> expert_counts(std::span<const int32_t> experts, int64_t E) {
  std::vector<int64_t> counts(static_cast<size_t>(E), 0);
  for (int32_t e : experts) {
    if (e < 0 || e >= E)
      throw std::invalid_argument("moe: expert id " + std::to_string(e) + " outside [0," +
                                  std::to_string(E) + ")");
    ++counts[static_cast<size_t>(e)];
  }
  return counts;
}

// logits (N,E) -> scores (N,E), weights (N,K), experts (N*K).
inline void router_forward(const float* logits, int64_t N, int64_t E, int K, RouterScore score,
                           float* scores, float* weights, int32_t* experts) {
  for (int64_t n = 0; n < N; ++n) {
    const float* l = logits + n * E;
    float* s = scores + n * E;
    if (score == RouterScore::softmax) {
      float mx = l[0];
      for (int64_t e = 1; e < E; ++e) mx = std::max(mx, l[e]);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(double(l[e]) - mx);
      for (int64_t e = 0; e < E; ++e) s[e] = float(std::exp(double(l[e]) - mx) / sum);
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = float(1.0 / (1.0 + std::exp(-double(l[e]))));
    }
    int32_t* sel = experts + n * K;
    double chosen = 0;
    for (int k = 0; k < K; ++k) {
      int32_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        if (std::find(sel, sel + k, int32_t(e)) != sel + k) continue;
        if (best < 0 || s[e] > s[best]) best = int32_t(e);
      }
      sel[k] = best;
      chosen += s[best];
    }
    float* w = weights + n * K;
    for (int k = 0; k < K; ++k) w[k] = K > 1 ? float(s[sel[k]] / chosen) : s[sel[k]];
  }
}

// The per-token probabilities the loss averages: p = s, or s / sum(s) for sigmoid scores.
inline void aux_probs(const float* s, int64_t E, RouterScore score, double* p) {
  double total = 1;
  if (score == RouterScore::sigmoid) {
    total = 0;
    for (int64_t e = 0; e < E; ++e) total += s[e];
  }
  for (int64_t e = 0; e < E; ++e) p[e] = s[e] / total;
}

// The load-balancing loss's per-expert sums over N tokens: sums[e] = copies routed to e,
// sums[E + e] = sum over the tokens of p[n,e]. Under tensor parallelism each rank sums its
// token slice and the ranks add theirs (Megatron-Core's sequence_partition_group).
inline void aux_sums(const float* scores, int64_t N, int64_t E, std::span<const int32_t> experts,
                     RouterScore score, double* sums) {
  const std::vector<int64_t> counts = expert_counts(experts, E);
  std::vector<double> p(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) sums[e] = double(counts[e]), sums[E + e] = 0;
  for (int64_t n = 0; n < N; ++n) {
    aux_probs(scores + n * E, E, score, p.data());
    for (int64_t e = 0; e < E; ++e) sums[E + e] += p[e];
  }
}

// The loss of the sums (aux_sums) of `tokens` tokens.
inline double aux_loss_of(const double* sums, int64_t E, double tokens, int K, double coeff) {
  if (tokens == 0 || coeff == 0) return 0;
  double sum = 0;
  for (int64_t e = 0; e < E; ++e) sum += (sums[e] / (tokens * K)) * (sums[E + e] / tokens);
  return coeff * double(E) * sum;
}

// d aux / d p[n,e], the same for every token: aux_scale * E * f_e / tokens (coeff 1).
inline std::vector<double> aux_grad(const double* sums, int64_t E, double tokens, int K,
                                    double aux_scale) {
  std::vector<double> a(static_cast<size_t>(E), 0.0);
  if (aux_scale != 0 && tokens > 0)
    for (int64_t e = 0; e < E; ++e)
      a[e] = aux_scale * double(E) * (sums[e] / (tokens * K)) / tokens;
  return a;
}

inline double aux_loss(const float* scores, int64_t N, int64_t E, std::span<const int32_t> experts,
                       int K, RouterScore score, double coeff) {
  if (N == 0 || coeff == 0) return 0;
  std::vector<double> sums(static_cast<size_t>(2 * E));
  aux_sums(scores, N, E, experts, score, sums.data());
  return aux_loss_of(sums.data(), E, double(N), K, coeff);
}

// dlogits (N,E) overwritten: the gradient through the combine weights (dweights (N,K)) plus
// that of the load-balancing loss, given per expert as a (aux_grad; null: none).
inline void router_backward(float* dlogits, const float* dweights, const float* scores,
                            const float* weights, std::span<const int32_t> experts, int64_t N,
                            int64_t E, int K, RouterScore score, const double* a) {
  std::vector<double> ds(static_cast<size_t>(E)), p(static_cast<size_t>(E));
  for (int64_t n = 0; n < N; ++n) {
    const float* s = scores + n * E;
    const float* dw = dweights + n * K;
    const float* w = weights + n * K;
    const int32_t* sel = experts.data() + n * K;
    std::fill(ds.begin(), ds.end(), 0.0);
    if (K > 1) {
      double chosen = 0, gw = 0;
      for (int k = 0; k < K; ++k) {
        chosen += s[sel[k]];
        gw += double(dw[k]) * w[k];
      }
      for (int k = 0; k < K; ++k) ds[sel[k]] += (dw[k] - gw) / chosen;
    } else {
      ds[sel[0]] += dw[0];
    }
    if (a) {
      if (score == RouterScore::softmax) {
        for (int64_t e = 0; e < E; ++e) ds[e] += a[e];
      } else {
        double total = 0, ap = 0;
        for (int64_t e = 0; e < E; ++e) total += s[e];
        aux_probs(s, E, score, p.data());
        for (int64_t e = 0; e < E; ++e) ap += a[e] * p[e];
        for (int64_t e = 0; e < E; ++e) ds[e] += (a[e] - ap) / total;
      }
    }
    float* dl = dlogits + n * E;
    if (score == RouterScore::softmax) {
      double dot = 0;
      for (int64_t e = 0; e < E; ++e) dot += ds[e] * s[e];
      for (int64_t e = 0; e < E; ++e) dl[e] = float(s[e] * (ds[e] - dot));
    } else {
      for (int64_t e = 0; e < E; ++e) dl[e] = float(ds[e] * s[e] * (1.0 - s[e]));
    }
  }
}

// out (M,C): out[i] = inp[rows[i]].
inline void gather_rows(float* out, const float* inp, int64_t in_rows, int64_t C,
                        std::span<const int32_t> rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] < 0 || rows[i] >= in_rows)
      throw std::invalid_argument("gather_rows: row " + std::to_string(rows[i]) + " outside [0," +
                                  std::to_string(in_rows) + ")");
    std::copy(inp + rows[i] * C, inp + (rows[i] + 1) * C, out + int64_t(i) * C);
  }
}

inline void check_slots(const char* kernel, std::span<const int32_t> slots, int64_t M) {
  for (int32_t s : slots)
    if (s < 0 || s >= M)
      throw std::invalid_argument(std::string(kernel) + ": slot " + std::to_string(s) +
                                  " outside [0," + std::to_string(M) + ")");
}

// out (N,C) = sum_k weights[n,k] * inp[slots[n*K+k]]; weights null = all ones.
inline void combine_forward(float* out, const float* inp, int64_t M, const float* weights,
                            std::span<const int32_t> slots, int64_t N, int K, int64_t C) {
  check_slots("moe_combine", slots, M);
  for (int64_t n = 0; n < N; ++n) {
    float* o = out + n * C;
    std::fill(o, o + C, 0.0f);
    for (int k = 0; k < K; ++k) {
      const float w = weights ? weights[n * K + k] : 1.0f;
      const float* x = inp + int64_t(slots[n * K + k]) * C;
      for (int64_t c = 0; c < C; ++c) o[c] += w * x[c];
    }
  }
}

// dinp (M,C): row slots[n*K+k] = weights[n,k] * dout[n] (every row is some token's copy);
// dweights (N,K) = dout[n] . inp[slots[n*K+k]] (overwritten).
inline void combine_backward(float* dinp, float* dweights, const float* dout, const float* inp,
                             int64_t M, const float* weights, std::span<const int32_t> slots,
                             int64_t N, int K, int64_t C) {
  check_slots("moe_combine_backward", slots, M);
  for (int64_t n = 0; n < N; ++n) {
    const float* g = dout + n * C;
    for (int k = 0; k < K; ++k) {
      const int64_t slot = slots[n * K + k];
      const float w = weights[n * K + k];
      const float* x = inp + slot * C;
      float* dx = dinp + slot * C;
      double dot = 0;
      for (int64_t c = 0; c < C; ++c) {
        dx[c] = w * g[c];
        dot += double(g[c]) * x[c];
      }
      dweights[n * K + k] = float(dot);
    }
  }
}

}  // namespace stratagem::moe_math
