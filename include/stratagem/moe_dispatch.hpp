// Expert parallelism's token exchange (Megatron-Core's MoEAlltoAllTokenDispatcher): the ep
// group's members each hold experts/ep consecutive experts (member j: experts
// [j*L, (j+1)*L), L = experts/ep). A member's tokens, permuted into expert order
// (moe_block.hpp), go to the members holding their experts in one all-to-all, after an
// all-to-all of the counts; the received rows are regrouped from (source, expert) order into
// (expert, source) order, so each held expert's rows are contiguous for its GEMMs. The combine
// runs the same way back. Backward sends the gradients along the same paths.
//
//   forward:  permuted (N*K,C) --dispatch--> expert_in (M,C) --experts--> expert_out (M,C)
//             --combine--> combined (N*K,C)            (M: the rows this member's experts got)
//   backward: d_combined --dispatch--> d_expert_out --experts'--> d_expert_in --combine-->
//             d_permuted
#pragma once
#include <cstdint>
#include <vector>

#include "stratagem/backend.hpp"
#include "stratagem/comm.hpp"
#include "stratagem/moe_block.hpp"

namespace stratagem {

// The exchange of one micro-batch of one MoE layer, from its routing (counts per expert).
struct ExpertExchange {
  int members = 1, local_experts = 0;
  std::vector<int64_t> send_rows;     // (ep) rows this member sends to each member
  std::vector<int64_t> recv_rows;     // (ep) rows it receives from each member
  std::vector<int64_t> local_counts;  // (L) rows of each held expert, over all sources
  // expert_in row k = received row regroup[k] (received rows in (source, expert) order);
  // ungroup is its inverse (received row i = expert_out row ungroup[i]).
  std::vector<int32_t> regroup, ungroup;
  int64_t received() const { return int64_t(regroup.size()); }
};
// Collective over `ep`: exchanges the counts. `counts` (E) are this member's copies per expert.
ExpertExchange plan_exchange(Communicator& ep, const std::vector<int64_t>& counts);

// Rows of C floats from `send` (in expert order) to the members holding their experts:
// `received` gets recv_rows from each member, in member order. `back` reverses the direction
// (the combine): send holds the received layout, received the original one. Blocking.
void exchange_rows(Communicator& ep, const ExpertExchange& x, const Tensor& send, Tensor& received,
                   bool back);

// The whole FFN of an MoE layer under expert parallelism: y (N,C) overwritten. The member
// holds the experts w.first_expert ... (ep group `ep`, its experts/ep of them); the expert
// weight gradients it accumulates are those of its experts over every member's tokens.
void moe_forward_ep(Backend& be, Communicator& ep, const TransformerConfig& cfg,
                    const LayerWeights& w, const Tensor& xn, Tensor& y, MoeActs& a,
                    ExpertExchange& x);
// d_xn (N,C) overwritten.
void moe_backward_ep(Backend& be, Communicator& ep, const TransformerConfig& cfg,
                     const LayerWeights& w, LayerWeights& g, const Tensor& dy, const Tensor& xn,
                     const MoeActs& a, const ExpertExchange& x, double aux_scale, Tensor& d_xn);

}  // namespace stratagem
