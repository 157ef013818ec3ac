// Context parallelism's attention on the runtime: the sequence of one micro-batch is split over
// the cp group, and attention runs over it in one of three ways (plan.hpp's CpKind):
//  - ring (Megatron-Core): K,V blocks pass around the group point to point while each rank
//    attends its queries to the block at hand; partial results merge by the online softmax
//    (FlashAttention's rescaling); in backward the dK,dV of each block travel with it and
//    arrive back at its owner after a full turn;
//  - allgather (Llama 3): K,V gathered over the group, each rank attends its queries to the
//    whole sequence; dK,dV reduce-scattered back;
//  - a2a (DeepSpeed-Ulysses): an all-to-all turns the sequence split into a head split, each
//    rank runs whole-sequence attention on heads / cp heads, and an all-to-all turns it back.
//
// The load-balanced chunk order (Megatron-Core): the sequence of T tokens is cut into 2 * cp
// chunks of T / (2 cp); rank r holds chunks r and 2 cp - 1 - r, in that order, so that every
// rank has the same share of the causal work. Everything that reads positions (the data, the
// learned or rotary positions, the attention mask) follows cp_chunks.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "stratagem/backend.hpp"
#include "stratagem/comm.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/tensor.hpp"
#include "stratagem/transformer.hpp"

namespace stratagem {

// The two chunks of `rank`: rows [0, c) and [c, 2c) of its local (B, T / cp, ...) tensors.
struct CpChunks {
  TokenSpan first, second;
};
// Throws std::invalid_argument unless 2 * cp divides seq_len.
CpChunks cp_chunks(int rank, int cp, int64_t seq_len);
// The sequence position of each of the rank's T / cp local rows.
std::vector<int64_t> cp_positions(int rank, int cp, int64_t seq_len);

// One layer's attention over the cp group `comm` (its size is cp; its rank is the chunk
// owner's index). qkv (B, T/cp, (NH+2KV)*hd) holds the rank's rows in chunk order, with RoPE
// already applied at their global positions. Shapes as Backend::attention_forward's, without
// the probabilities (never kept: they would be T x T/cp per head).
//
// For a2a, qkv is OVERWRITTEN with its whole-sequence head group (B, T, (NH+2KV)/cp*hd) and
// lse holds (B, NH/cp, T): the same sizes, and what the backward needs; out is local.
struct CpAttention {
  CpKind kind = CpKind::ring;
  int heads = 0, kv_heads = 0;
  int64_t seq_len = 0;  // the whole sequence T
  CpScratch scratch;    // the working tensors' memory (empty: Backend::allocate)
};
void cp_attention_forward(Backend& be, Communicator& comm, const CpAttention& a, Tensor& out,
                          Tensor& lse, Tensor& qkv);
// dqkv (B, T/cp, (NH+2KV)*hd) is overwritten; dout, out, lse, qkv as the forward left them.
void cp_attention_backward(Backend& be, Communicator& comm, const CpAttention& a, Tensor& dqkv,
                           const Tensor& dout, const Tensor& out, const Tensor& lse,
                           const Tensor& qkv);

// The attention of a layer of shape `c` on the share `seq` (seq.split()).
CpAttention cp_attention(const TransformerConfig& c, const SequenceShare& seq);

// RoPE on the rank's rows (B, T/cp, (NH+2KV)*hd) at their chunks' positions (backward: the
// inverse rotation of a gradient).
void cp_rope(Backend& be, const SequenceShare& seq, Tensor& qkv, const TransformerConfig& c,
             bool backward);
// The embedding of the rank's rows with the learned positions of their chunks; ids (B*T/cp).
void cp_embedding_forward(Backend& be, const SequenceShare& seq, Tensor& x_out,
                          std::span<const int32_t> ids, const Tensor& wte, const Tensor& wpe);
void cp_embedding_backward(Backend& be, const SequenceShare& seq, Tensor& dwte, Tensor& dwpe,
                           std::span<const int32_t> ids, const Tensor& dx);

}  // namespace stratagem
