// The Mixture-of-Experts FFN of one Transformer layer as separately callable pieces, split where
// expert parallelism puts its all-to-alls (Megatron-Core's MoELayer with the all-to-all token
// dispatcher):
//
//   forward  = router -> permute (tokens into expert order) -> [dispatch all-to-all, regroup]
//              -> experts (one GEMM pair per held expert over its rows) -> [regroup back,
//              combine all-to-all] -> combine (weighted sum of each token's K outputs)
//              (+ the shared experts, a dense MLP on every token)
//   backward = the same in reverse; the router also receives the load-balancing loss.
//
// With ep = 1 the all-to-alls vanish and moe_forward / moe_backward run the whole FFN. Routing
// is dropless: every token reaches its K experts. The routing decisions live on the host
// (MoeRouting): the dispatch's counts are built from them.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "stratagem/transformer.hpp"

namespace stratagem {

// Where each token's K copies go, in one micro-batch: copies are ordered by expert, and inside
// an expert by (token, k), so the rows of each expert are contiguous.
struct MoeRouting {
  int experts = 0, top_k = 0;
  std::vector<int32_t> chosen;  // (N*K) expert of copy (n,k), from the router
  std::vector<int64_t> counts;  // (E) copies routed to each expert
  std::vector<int32_t> slots;   // (N*K) expert-ordered row of copy (n,k)
  std::vector<int32_t> source;  // (N*K) token of each expert-ordered row
  int64_t tokens() const { return top_k ? int64_t(chosen.size()) / top_k : 0; }
};
MoeRouting route_tokens(std::span<const int32_t> chosen, int experts, int top_k);

// Saved tensors of one MoE FFN for one micro-batch (N tokens, M rows at this rank's experts).
struct MoeActs {
  Tensor logits;   // (N,E) the router's output (transient)
  Tensor scores;   // (N,E)
  Tensor weights;  // (N,K) combine weights
  MoeRouting routing;
  double aux_loss = 0;  // the load-balancing loss of these tokens (coeff included)
  // Its sums (Backend::moe_aux_sums: copies per expert, then summed probabilities) and the
  // tokens they cover: this rank's, or under tp > 1 the micro-batch's once the tp ranks have
  // added theirs (moe_aux_loss_of then takes the loss again).
  std::vector<double> aux_sums;
  double aux_tokens = 0;
  // The held experts' rows in local expert order, and the counts of each held expert.
  std::vector<int64_t> local_counts;
  Tensor expert_in;   // (M,C)
  Tensor fc1_out;     // (M,2Fe | Fe)
  Tensor act_out;     // (M,Fe)
  Tensor expert_out;  // (M,C)
  // The combine's input: all N*K copies in expert order, back at the token's rank.
  Tensor combined_in;  // (N*K,C)
  // Shared experts.
  Tensor shared_fc1_out, shared_act_out;
  // Where the pieces take the tensors they save (above) and their transient scratch; unset:
  // Backend::allocate. The executor points them at its Program's buffers and scratch, so the
  // memory it measures holds them.
  std::function<Tensor(Shape)> saved, scratch;
  Tensor save(Backend& be, Shape s) const { return saved ? saved(s) : be.allocate(s); }
  Tensor temp(Backend& be, Shape s) const { return scratch ? scratch(s) : be.allocate(s); }
};

// ---- pieces --------------------------------------------------------------------------------
// xn (N,C) -> router logits, scores, weights, the routing and the aux loss value.
void moe_router_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                        const Tensor& xn, MoeActs& a);
// The load-balancing loss of a.aux_sums over a.aux_tokens (coeff included), into a.aux_loss.
void moe_aux_loss_of(const TransformerConfig& cfg, MoeActs& a);
// d_weights (N,K) -> router weight gradient (accumulates); d_xn (N,C) ACCUMULATES. The loss's
// gradient follows from a.aux_sums and a.aux_tokens (all the micro-batch's tokens).
// aux_scale = the aux loss's weight in this micro-batch's loss (its loss scale).
void moe_router_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                         LayerWeights& g, const Tensor& d_weights, const Tensor& xn,
                         const MoeActs& a, double aux_scale, Tensor& d_xn);

// permuted (N*K,C) = xn rows in expert order; backward: d_xn (N,C) = the sum of each token's
// K copies of d_permuted (overwritten).
void moe_permute_forward(Backend& be, const Tensor& xn, const MoeRouting& r, Tensor& permuted);
void moe_permute_backward(Backend& be, const Tensor& d_permuted, const MoeRouting& r, Tensor& d_xn);

// The held experts on their rows: in (M,C) holds counts[i] rows of held expert i after those
// of expert i-1. Saves fc1_out, act_out in a; out (M,C) is this etp rank's partial sum.
void moe_experts_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                         const Tensor& in, std::span<const int64_t> counts, MoeActs& a,
                         Tensor& out);
// d_in (M,C) overwritten (this etp rank's partial); expert weight gradients accumulate.
void moe_experts_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                          LayerWeights& g, const Tensor& dout, const Tensor& in,
                          std::span<const int64_t> counts, const MoeActs& a, Tensor& d_in);

// y (N,C) = sum_k weights[n,k] * expert_rows[slot(n,k)] (overwritten); backward gives
// d_expert_rows (N*K,C) and d_weights (N,K).
void moe_combine_forward(Backend& be, const Tensor& expert_rows, const MoeActs& a, Tensor& y);
void moe_combine_backward(Backend& be, const Tensor& dy, const MoeActs& a, Tensor& d_expert_rows,
                          Tensor& d_weights);

// Shared experts: y (N,C) += this tp rank's partial sum of the shared MLP on xn; backward:
// d_xn (N,C) ACCUMULATES this rank's partial. No-ops without shared experts.
void moe_shared_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                        const Tensor& xn, MoeActs& a, Tensor& y);
void moe_shared_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w,
                         LayerWeights& g, const Tensor& dy, const Tensor& xn, const MoeActs& a,
                         Tensor& d_xn);

// ---- the whole FFN on one rank that holds every expert (ep = etp = tp = 1) ------------------
// y (N,C) overwritten; d_xn (N,C) overwritten.
void moe_forward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w, const Tensor& xn,
                 Tensor& y, MoeActs& a);
void moe_backward(Backend& be, const TransformerConfig& cfg, const LayerWeights& w, LayerWeights& g,
                  const Tensor& dy, const Tensor& xn, const MoeActs& a, double aux_scale,
                  Tensor& d_xn);

}  // namespace stratagem
