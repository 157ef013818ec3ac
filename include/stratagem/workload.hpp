// Workload: what one block of a Transformer does on one rank, derived from the model shapes and
// the layer's strategy. The Program generator takes FLOPs, bytes and memory from here, and the
// cost model takes the GEMM shapes from here, so there is one description of the work.
#pragma once
#include <array>
#include <cstdint>

#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"

namespace stratagem {

// The unit of work of the Program: a Transformer layer is an attention and an mlp block. An
// MoE layer's mlp runs as three compute parts around its all-to-alls (src/core/program_moe.cpp):
// router (norm, router, top-k, permutation, shared experts), experts (the routed experts'
// grouped GEMMs) and combine (un-permutation, weighted sum, residual).
enum class Block : uint8_t {
  none,
  embedding,
  attention,
  mlp,
  head,
  optimizer,
  reshard,
  router,
  experts,
  combine
};

struct Gemm {
  int64_t m = 0, n = 0, k = 0;  // (m,k) x (k,n)
  int64_t count = 1;            // batched count (e.g. heads)
  double flops() const { return 2.0 * m * n * k * count; }
};

// Kernels of one block pass on one rank. Elementwise work is given as HBM bytes.
struct BlockWork {
  // MLA's attention has five GEMMs, ten in backward (workload_mla.cpp).
  static constexpr int kMaxGemms = 12;
  std::array<Gemm, kMaxGemms> gemms{};
  int num_gemms = 0;
  double attention_flops = 0;    // QK^T + AV core
  bool flash_attention = false;  // the core runs as a fused kernel (its efficiency)
  double elementwise_bytes = 0;  // norms, activations, softmax, residual, dropout (HBM traffic)
  int kernels = 0;               // kernel launches
  double gemm_flops() const;
  double flops() const { return gemm_flops() + attention_flops; }
  void add(Gemm g);
};

// Forward work of a block (attention or mlp) for `samples` samples on a rank of `s`.
BlockWork forward_work(const ModelSpec& m, const LayerStrategy& s, Block b, int samples,
                       bool flash_attention);
// Backward is the two GEMMs per forward GEMM (dgrad, wgrad) and ~2x the elementwise traffic.
BlockWork backward_work(const ModelSpec& m, const LayerStrategy& s, Block b, int samples,
                        bool flash_attention);
// The backward of any forward work, by the rule above (the profile applies it to the attention
// core alone).
BlockWork backward_of(const BlockWork& forward);
// The zero-bubble schedules' split backward (schedule.hpp): B, the input gradient (each GEMM's
// data gradient, the attention core's backward, the elementwise passes), and W, the weight
// gradient (each GEMM's weight gradient). Together they are backward_of's work.
BlockWork input_grad_of(const BlockWork& forward);
BlockWork weight_grad_of(const BlockWork& forward);
// What a block's W reads besides the weights (the paper's M_W: 32 s b h bytes of a bf16 layer):
// the GEMMs' inputs that its forward saved, held from forward to W (weight_input_bytes), and
// what its B leaves (weight_stash_bytes): each GEMM's output gradient and, under sequence
// parallelism, the first GEMM's gathered input (forward saves only this rank's shard of it).
int64_t weight_input_bytes(const ModelSpec& m, const LayerStrategy& s, Block b, int samples,
                           Dtype dt);
int64_t weight_stash_bytes(const ModelSpec& m, const LayerStrategy& s, Block b, int samples,
                           Dtype dt);
// Context parallelism runs a layer's attention block in parts so that its cp communication can
// sit between them (program_cp.cpp): `pre` (the norm, the QKV projection, RoPE), the attention
// core, and `post` (the output projection, dropout, residual). `whole` is the block unsplit.
enum class AttentionPart : uint8_t { whole, pre, core, post };
const char* to_string(AttentionPart p);
// Steps the attention core of a layer runs in: cp under the ring (one per K/V block), else 1.
inline int cp_core_steps(const LayerStrategy& s) {
  return s.cp > 1 && s.cp_kind == CpKind::ring ? s.cp : 1;
}
// Forward work of one part of an attention block (the core: one of its cp_core_steps equal
// steps); pre + steps x core + post is forward_work's attention. Backward: backward_of it.
BlockWork attention_part_work(const ModelSpec& m, const LayerStrategy& s, AttentionPart part,
                              int samples, bool flash_attention);
// Work of just the attention core (QK^T, softmax, AV).
BlockWork attention_core_work(const ModelSpec& m, const LayerStrategy& s, int samples,
                              bool flash_attention);
// What selective recompute (without flash attention) redoes before the attention backward: the
// attention probabilities, QK^T and the softmax (AV's output is saved as the projection input).
BlockWork selective_recompute_work(const ModelSpec& m, const LayerStrategy& s, int samples);

// Bytes of activations a block keeps for backward on one rank, derived tensor by tensor from
// the ops that save them (see workload.cpp). Recompute::full keeps only the layer input (charged
// to the attention block); selective drops the attention probabilities and dropout mask.
int64_t saved_activation_bytes(const ModelSpec& m, const LayerStrategy& s, Block b, int samples,
                               Recompute rc, bool flash_attention, Dtype dt);
// What a block keeps for backward as the Program allocates it: saved_activation_bytes and the
// per-token fp32 statistics Megatron's count leaves out as small: the norm's 1/rms (and mean
// under layernorm) on the block's token shard and, without flash attention (which counts it),
// the softmax's log-sum-exp per head. A fully recomputed block keeps none of them.
int64_t kept_activation_bytes(const ModelSpec& m, const LayerStrategy& s, Block b, int samples,
                              Recompute rc, bool flash_attention, Dtype dt);
// Bytes of the activations of block b that the layer's recompute rebuilds before its backward
// (beyond what it kept): the whole block under full recompute, the attention probabilities
// under selective recompute without flash attention, nothing otherwise.
int64_t recomputed_activation_bytes(const ModelSpec& m, const LayerStrategy& s, Block b,
                                    int samples, bool flash_attention, Dtype dt);
// Bytes of the whole token stream (b,s,h) of `samples` samples: the message of a block's
// tensor-parallel collectives and the embedding's output. A cp rank holds s / cp of each sample.
int64_t token_stream_bytes(const ModelSpec& m, int samples, Dtype dt, int cp = 1);
// Bytes of the layer output passed between layers/stages on one rank (b,s,h), sequence-sharded
// when sequence parallel.
int64_t boundary_activation_bytes(const ModelSpec& m, const LayerStrategy& s, int samples,
                                  Dtype dt);

// Device memory a rank uses besides the Program's buffers while it runs a layer of strategy s
// (the runtime's scratch, which frameworks hold as workspace and autograd temporaries):
//  - the backward kernels' scratch: gradients of qkv, of the attention output, of fc1 and of
//    the activation (tp shares);
//  - the token-stream tensors the runtime holds at once: the stream's value or gradient between
//    ops; under tensor parallelism a block's partial sum before its (in-place) reduction, or
//    under sequence parallelism the two whole-sequence gathers of a block's backward; under
//    full recompute, the stream the layer's backward rebuilds beside the gradient; `pipelined`
//    (a stage beside a pipeline): at least the stream, a send and a receive in flight.
// The received piece of a ZeRO reduce-scatter is not workspace: it is a Program buffer from the
// reduction's issue until it lands (iteration.hpp's receive_piece_bytes).
// (A fully recomputed layer's forward intermediates are transient too; they live while fewer
// activations are held than at the recompute that rebuilds them, so they do not add to it.)
// Staged ZeRO-2/3 gradients are not workspace: they are the Program's buffers, from a layer's
// backward until its reduce-scatter lands (staged_gradient_bytes).
int64_t layer_workspace_bytes(const ModelSpec& m, const LayerStrategy& s, int samples, Dtype dt,
                              bool pipelined = false);
// The same for the embedding and head of a stage: the token-stream tensors.
int64_t embedding_workspace_bytes(const ModelSpec& m, const LayerStrategy& s, int samples,
                                  Dtype dt);
// Bytes of `params` parameters' whole gradients that a framework staging them
// (FrameworkSpec::layer_gradient_staging) holds under strategy s until their reduce-scatter:
// 0 unless ZeRO-2/3 over dp > 1. The Program allocates them (category grads).
int64_t staged_gradient_bytes(const LayerStrategy& s, int64_t params, Dtype dt, bool staging);

// Parameters of a block held by one rank before ZeRO sharding (divided by tp where Megatron
// shards them, replicated norms/biases otherwise).
int64_t block_parameters_per_rank(const ModelSpec& m, int tp, Block b);
// Parameters of a whole layer (attention and mlp) on a rank of tensor degree tp.
int64_t layer_parameters_per_rank(const ModelSpec& m, int tp);
// Parameters of a block that every rank of its tp group holds whole and whose gradient each
// computes from its own token shard under sequence parallelism (the norm): summed over the
// group. (The row-parallel output bias is whole too, but its gradient comes from the gathered
// output gradient, the same on every rank.)
int64_t replicated_block_parameters(const ModelSpec& m, Block b);
int64_t replicated_head_parameters(const ModelSpec& m);  // the final norm
// Rows of the vocabulary-parallel word embedding (and LM head) on one rank: the vocabulary is
// padded to a multiple of tp, as the runtime (and Megatron-LM) pads it.
int64_t vocab_rows_per_rank(const ModelSpec& m, int tp);
// Embedding (+ LM head when untied) parameters on a rank of the first/last stage.
int64_t embedding_parameters_per_rank(const ModelSpec& m, int tp);
int64_t head_parameters_per_rank(const ModelSpec& m, int tp);  // untied head + final norm
// Parameters the LM head and loss read on a rank: its weight (the word embedding when tied) and
// the final norm. What a ZeRO-3 or offloaded head fetches; the lookup fetches
// embedding_parameters_per_rank, and the embedding backward reads no weights.
int64_t head_compute_parameters_per_rank(const ModelSpec& m, int tp);

// Megatron's model-FLOP count per iteration: 72 B s l h^2 (1 + s/6h + V/12lh) for GPT
// (generalized per layer for GQA/SwiGLU by counting the GEMMs). Recompute does not count.
double model_flops_per_iteration(const ModelSpec& m, int64_t global_batch);

}  // namespace stratagem
