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

// Expert tensor parallelism (etp > 1; Megatron-Core's all-to-all dispatcher with its
// tp group of experts): the etp members of an expert_tp group hold one shard each of the same
// experts (fc1 column-, fc2 row-sharded). After the dispatch each member all-gathers the rows
// the others received (gather_expert_rows), so that every shard sees every row of its experts;
// each member's partial outputs (and, backward, input gradients) are reduce-scattered back to
// the member that received the rows (reduce_expert_rows). Megatron-Core's
// MoEAlltoAllTokenDispatcher does the same (token_dispatcher.py: dispatch_postprocess
// all-gathers over its expert-tp group with output_split_sizes, then sort_chunks_by_idxs puts
// the rows in local-expert order; the combine reduce-scatters back).
struct ExpertGather {
  std::vector<int64_t> member_rows;  // (etp) rows each member received from the dispatch
  std::vector<int64_t> counts;       // (L) rows of each held expert, over all members
  // gathered row k (expert order) = member-ordered row regroup[k]; ungroup is its inverse.
  std::vector<int32_t> regroup, ungroup;
  int64_t gathered() const { return int64_t(regroup.size()); }
};
// Collective over `etp`: all-gathers the members' rows per held expert (`counts`, (L)).
ExpertGather plan_expert_gather(Communicator& etp, const std::vector<int64_t>& counts);
// rows (M,C), this member's in expert order -> gathered (sum of member_rows, C) in expert order.
void gather_expert_rows(Backend& be, Communicator& etp, const ExpertGather& g, const Tensor& rows,
                        Tensor& gathered, Tensor& scratch);
// partial (gathered, C) in expert order -> out (M,C): the sum over the members of this member's
// rows. `scratch` (gathered, C) holds the rows in member order.
void reduce_expert_rows(Backend& be, Communicator& etp, const ExpertGather& g,
                        const Tensor& partial, Tensor& out, Tensor& scratch);

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
