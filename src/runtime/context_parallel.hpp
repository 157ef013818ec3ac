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
#include <memory>
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

// The attention's working tensors (K,V blocks in flight, gathered K,V, head-split copies): the
// executor carves them from the Program's cp buffer; empty: Backend::allocate.
using CpScratch = std::function<Tensor(Shape)>;

struct CpAttention {
  CpKind kind = CpKind::ring;
  int heads = 0, kv_heads = 0;
  int64_t seq_len = 0;  // the whole sequence T
  CpScratch scratch;
};
// The attention of a layer of shape `c` on the share `seq` (seq.split()).
CpAttention cp_attention(const TransformerConfig& c, const SequenceShare& seq, CpScratch scratch);

// One layer's attention of one micro-batch in one phase over the cp group `comm` (its size is
// cp; its rank is the chunk owner's index), run op by op: each method is one op of the
// Program's (src/core/program_cp.cpp), and the executor calls them in the Program's order after
// the ops each waits for (src/runtime/exec/ops_cp.cpp). Shapes as Backend::attention_forward's,
// without the probabilities (never kept: they would be T x T/cp per head).
//
// A transfer returns its request and the bytes it moves, counted as the Program counts the op's
// (iteration.hpp's CpComm: what a rank sends or receives; a collective's whole buffer). The
// ring keeps two K,V blocks: complete send_kv(j - 1) before
// recv_kv(j), which receives into its block; in backward, complete send_dkv(j - 1) before
// core(j), which writes its dK,dV where that send reads.
struct CpTransfer {
  RequestPtr request;  // nullptr: the kind has no such transfer
  int64_t bytes = 0;
};

class CpPass {
 public:
  struct Tensors {
    // (B, T/cp, (NH+2KV)*hd): the rank's rows in chunk order, RoPE applied at their global
    // positions. a2a: OVERWRITTEN by the forward's core with its head group over the whole
    // sequence (B, T, (NH+2KV)/cp*hd), the same size and what the backward reads.
    Tensor qkv;
    Tensor out;        // (B, T/cp, NH*hd): forward writes it (at finish under a2a)
    Tensor lse;        // (B, NH, T/cp); a2a: (B, NH/cp, T), the same size
    Tensor out_heads;  // a2a: the head group's output (B, T, NH/cp*hd), kept for the backward
                       // (a forward may leave it undefined: nothing is kept)
    Tensor dout;       // backward: the output's gradient, as out
    Tensor dqkv;       // backward: written, as qkv
  };
  CpPass(Backend& be, Communicator& comm, const CpAttention& a, bool backward, const Tensors& t);
  ~CpPass();
  CpPass(const CpPass&) = delete;
  CpPass& operator=(const CpPass&) = delete;

  // ring: the K,V block at hand at step j to the next rank; step j + 1's from the previous.
  CpTransfer send_kv(int step);
  CpTransfer recv_kv(int step);
  // ring backward: step j's dK,dV plus the accumulator received at step j - 1 (the same
  // block's) to the next rank; the next accumulator from the previous (at j = cp - 1: the sum
  // for the rank's own block).
  CpTransfer send_dkv(int step);
  CpTransfer recv_dkv(int step);
  // allgather and a2a: the collective before the core and the one after it.
  CpTransfer before();
  CpTransfer after();
  // The attention core of ring step j (0 for the other kinds).
  void core(int step);
  // The pass's end, after its last transfer: forward a2a places the output rows; backward
  // places the rank's dK,dV into dqkv.
  void finish();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

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
