// Backend: the numeric kernels of Transformer training, forward and backward, over Tensors in
// the backend's own memory. The CPU backend implements them with Eigen + OpenMP; a CUDA
// backend implements the same interface a second time. The Transformer blocks
// (transformer.hpp) only ever call these, so they run unchanged on either.
//
// Conventions shared by every kernel:
//  - shapes are in the comments as llm.c writes them: B batch, T time, C channels, V vocab,
//    NH query heads, KV key/value heads, hd head dim, OC output channels, N = B*T rows;
//  - linear weights are (OC, C) like torch.nn.Linear: out = inp @ weight^T + bias;
//  - an undefined Tensor (data == nullptr) passed for an optional input means "none";
//  - parameter gradients ACCUMULATE (+=) so micro-batches sum; activation gradients named
//    `dinp` are overwritten unless the kernel says it accumulates;
//  - token ids and targets are host int32 arrays (small; a device backend copies them);
//  - a shape that does not fit throws std::invalid_argument naming kernel and operand.
// A Backend is not thread-safe: one caller thread issues kernels, each kernel parallelizes.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "stratagem/model.hpp"  // RouterScore
#include "stratagem/moe_math.hpp"
#include "stratagem/tensor.hpp"

namespace stratagem {

// Rows [row0, row0 + rows) of a (B,T,...) tensor, holding sequence positions pos0, pos0 + 1, ...
struct TokenSpan {
  int64_t row0 = 0;
  int64_t rows = 0;
  int64_t pos0 = 0;
};

// One AdamW step's hyperparameters (PyTorch's torch.optim.AdamW semantics).
struct AdamWStep {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0;  // decoupled: p -= lr * weight_decay * p before the Adam update
  int64_t step = 1;        // 1-based step count used for bias correction
};

// About 50 methods, one per kernel (and its backward), by design: a backend is a table of
// kernels each with a CPU reference and a CUDA version and one test for both (llm.c's way);
// splitting the table would split a kernel's forward from its backward or its peers.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Called by a host backend between its large kernels (GEMMs, attention), on the thread that
  // calls the kernels: MPI moves non-blocking collectives on only inside MPI calls, and a rank
  // that computes for long would hold its group's reductions back where a device's network
  // moves on by itself. The executor tests its transfers in flight here.
  void set_progress(std::function<void()> progress) { progress_ = std::move(progress); }

  // ---- memory ----------------------------------------------------------------------------
  virtual Tensor allocate(Shape shape) = 0;  // uninitialized
  Tensor zeros(Shape shape) {
    Tensor t = allocate(shape);
    fill(t, 0.0f);
    return t;
  }
  virtual void fill(Tensor& t, float value) = 0;
  virtual void copy(Tensor& dst, const Tensor& src) = 0;      // same numel
  virtual void upload(Tensor& dst, const float* host) = 0;    // dst.numel() floats
  virtual void download(float* host, const Tensor& src) = 0;  // src.numel() floats
  virtual void synchronize() {}
  // A rectangle of rows and columns, each tensor viewed as (numel / last dim, last dim):
  // dst[dst_row0 + i][dst_col0 + j] = src[src_row0 + i][src_col0 + j]. Moves sequence chunks
  // and head groups between the layouts of context parallelism; the two must not overlap.
  virtual void copy_block(Tensor& dst, int64_t dst_row0, int64_t dst_col0, const Tensor& src,
                          int64_t src_row0, int64_t src_col0, int64_t rows, int64_t cols) {
    (void)dst, (void)dst_row0, (void)dst_col0, (void)src, (void)src_row0, (void)src_col0,
        (void)rows, (void)cols;
    unsupported("copy_block");
  }

  // ---- embedding --------------------------------------------------------------------------
  // out (B,T,C) = wte[tokens] (+ wpe[t] when wpe is defined: learned positions; undefined for
  // RoPE). tokens (B*T) host ids; wte (V,C); wpe (maxT,C) with T <= maxT. An id of -1 marks a
  // token held by another vocabulary shard (tensor parallelism): its row is zero (+ wpe), and
  // backward skips it.
  virtual void embedding_forward(Tensor& out, std::span<const int32_t> tokens, const Tensor& wte,
                                 const Tensor& wpe) = 0;
  // dwte (V,C) += scatter of dout; dwpe (maxT,C) += sum over B (skipped when undefined).
  virtual void embedding_backward(Tensor& dwte, Tensor& dwpe, std::span<const int32_t> tokens,
                                  const Tensor& dout) = 0;

  // ---- normalization (over the last dim C; leading dims are rows) -------------------------
  // out (N,C), mean (N), rstd (N); bias undefined = LayerNorm without bias.
  virtual void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& inp,
                                 const Tensor& weight, const Tensor& bias, float eps) = 0;
  // dinp (N,C) ACCUMULATES (it is the residual stream's gradient); dweight, dbias accumulate.
  virtual void layernorm_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight, const Tensor& mean,
                                  const Tensor& rstd) = 0;
  virtual void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& inp, const Tensor& weight,
                               float eps) = 0;
  // dinp ACCUMULATES, as for layernorm.
  virtual void rmsnorm_backward(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                const Tensor& inp, const Tensor& weight, const Tensor& rstd) = 0;

  // ---- linear -----------------------------------------------------------------------------
  // out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias (OC).
  virtual void matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias) = 0;
  // dinp (N,C) = dout @ weight (overwritten); dweight += dout^T @ inp; dbias += column sums of
  // dout. Each is skipped when undefined (a split backward's B and W compute them apart).
  virtual void matmul_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                               const Tensor& inp, const Tensor& weight) = 0;

  // ---- rotary positions (LLaMA convention: rotate halves of each head, position = t) ------
  // In place on the q and k parts of qkv (B,T,(NH+2KV)*hd); v is left alone.
  virtual void rope_forward(Tensor& qkv, int heads, int kv_heads, float theta) = 0;
  // In place on dqkv: applies the inverse rotation to the q and k gradients.
  virtual void rope_backward(Tensor& dqkv, int heads, int kv_heads, float theta) = 0;
  // The same on rows that hold positions pos0, pos0 + 1, ... (position = pos0 + t): one chunk
  // of the sequence under context parallelism.
  virtual void rope_forward_from(Tensor& qkv, int heads, int kv_heads, float theta, int64_t pos0) {
    (void)qkv, (void)heads, (void)kv_heads, (void)theta, (void)pos0;
    unsupported("rope_forward_from");
  }
  virtual void rope_backward_from(Tensor& dqkv, int heads, int kv_heads, float theta,
                                  int64_t pos0) {
    (void)dqkv, (void)heads, (void)kv_heads, (void)theta, (void)pos0;
    unsupported("rope_backward_from");
  }

  // ---- causal self-attention with grouped key/value heads ---------------------------------
  // qkv (B,T,(NH+2KV)*hd) holds [q heads | k heads | v heads] per token; query head h reads
  // kv head h / (NH/KV). out (B,T,NH*hd). lse (B,NH,T) = log-sum-exp of each score row, saved
  // so the probabilities can be rebuilt cheaply. att (B,NH,T,T): the probabilities, written
  // when defined (entries above the diagonal are unspecified); undefined = not kept.
  virtual void attention_forward(Tensor& out, Tensor& att, Tensor& lse, const Tensor& qkv,
                                 int heads, int kv_heads) = 0;
  // dqkv (B,T,(NH+2KV)*hd) overwritten. When att is undefined the probabilities are
  // recomputed from qkv and lse (selective recompute).
  virtual void attention_backward(Tensor& dqkv, const Tensor& dout, const Tensor& out,
                                  const Tensor& qkv, const Tensor& att, const Tensor& lse,
                                  int heads, int kv_heads) = 0;

  // ---- attention in blocks (context parallelism) -------------------------------------------
  // When the sequence is split over ranks, attention runs as blocks of queries against blocks
  // of keys and values (some from other ranks), merged with FlashAttention's online softmax.
  // A TokenSpan names rows [row0, row0 + rows) of a (B,T,...) tensor and the sequence position
  // of row0 (rows hold consecutive positions); the causal mask compares positions: a query at
  // p sees a key at p' iff p' <= p. q is a qkv tensor (B,Tq,(NH+2KV)*hd) of which the q heads
  // are read; kv is (B,Tk,X) whose last 2*KV*hd columns are [k heads | v heads] (a qkv tensor,
  // or a packed (B,Tk,2*KV*hd) block received from another rank).
  //
  // On the q span's rows: out (B,Tq,NH*hd) = the attention of the queries over the visible
  // keys of the kv span alone, lse (B,NH,Tq) = the log-sum-exp of their scores; a row that
  // sees no key gets out 0 and lse -inf. Other rows are left alone.
  virtual void attention_block_forward(Tensor& out, Tensor& lse, const Tensor& q, TokenSpan qs,
                                       const Tensor& kv, TokenSpan ks, int heads, int kv_heads) {
    (void)out, (void)lse, (void)q, (void)qs, (void)kv, (void)ks, (void)heads, (void)kv_heads;
    unsupported("attention_block_forward");
  }
  // The online-softmax merge on the span's rows (its pos0 is unused): (out, lse) and the
  // partial result (part_out, part_lse) over disjoint key sets become the attention over their
  // union, in out and lse. Shapes as attention_block_forward's out and lse.
  virtual void attention_merge(Tensor& out, Tensor& lse, const Tensor& part_out,
                               const Tensor& part_lse, TokenSpan span) {
    (void)out, (void)lse, (void)part_out, (void)part_lse, (void)span;
    unsupported("attention_merge");
  }
  // The backward of one block pair. out, lse: the FINAL (merged) output and log-sum-exp of
  // the q span's rows; dout its gradient. dq's q columns ACCUMULATE on the q span's rows,
  // dkv's last 2*KV*hd columns ACCUMULATE on the kv span's rows (dq and dkv may be one tensor
  // when q and kv are: the columns are disjoint).
  virtual void attention_block_backward(Tensor& dq, Tensor& dkv, const Tensor& dout,
                                        const Tensor& out, const Tensor& lse, const Tensor& q,
                                        TokenSpan qs, const Tensor& kv, TokenSpan ks, int heads,
                                        int kv_heads) {
    (void)dq, (void)dkv, (void)dout, (void)out, (void)lse, (void)q, (void)qs, (void)kv, (void)ks,
        (void)heads, (void)kv_heads;
    unsupported("attention_block_backward");
  }

  // ---- pointwise --------------------------------------------------------------------------
  // GELU, tanh approximation (GPT-2). Same shapes in and out.
  virtual void gelu_forward(Tensor& out, const Tensor& inp) = 0;
  virtual void gelu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) = 0;
  // SwiGLU: inp (N,2F) = [gate | up] -> out (N,F) = silu(gate) * up.
  virtual void swiglu_forward(Tensor& out, const Tensor& inp) = 0;
  virtual void swiglu_backward(Tensor& dinp, const Tensor& dout, const Tensor& inp) = 0;
  // out = a + b (out may alias a or b).
  virtual void residual_forward(Tensor& out, const Tensor& a, const Tensor& b) = 0;
  // The residual's backward: dinp += dout (the gradient reaches both branches unchanged).
  virtual void residual_backward(Tensor& dinp, const Tensor& dout) = 0;

  // ---- loss -------------------------------------------------------------------------------
  // losses (N) = logsumexp(logits (N,V)) - logits[target]; targets (N) in [0,V).
  virtual void crossentropy_forward(Tensor& losses, const Tensor& logits,
                                    std::span<const int32_t> targets) = 0;
  // dlogits (N,V) = (softmax(logits) - onehot(target)) * scale; dlogits may alias logits.
  virtual void crossentropy_softmax_backward(Tensor& dlogits, const Tensor& logits,
                                             std::span<const int32_t> targets, float scale) = 0;

  // Vocabulary-parallel cross-entropy (Megatron-LM): logits (N,Vl) hold vocabulary ids
  // [vocab_begin, vocab_begin + valid) in their first `valid` columns; later columns pad the
  // vocabulary to a multiple of tp and are ignored. A caller reduces across the shards:
  //   max (N)      = row maxima of the valid columns            (then all-reduce max)
  //   sums (N,2)   = [sum exp(logit - max), target logit or 0]   (then all-reduce sum)
  //   loss         = log(sums[:,0]) + max - sums[:,1]
  virtual void crossentropy_row_max(Tensor& max, const Tensor& logits, int64_t valid) = 0;
  virtual void crossentropy_sums(Tensor& sums, const Tensor& logits, const Tensor& max,
                                 std::span<const int32_t> targets, int64_t vocab_begin,
                                 int64_t valid) = 0;
  // dlogits (N,Vl) = (exp(logit - max) / sums[:,0] - onehot(target)) * scale on the valid
  // columns, 0 on the padding; dlogits may alias logits. max and sums are the reduced ones.
  virtual void crossentropy_shard_backward(Tensor& dlogits, const Tensor& logits, const Tensor& max,
                                           const Tensor& sums, std::span<const int32_t> targets,
                                           int64_t vocab_begin, int64_t valid, float scale) = 0;

  // ---- mixture of experts (moe_math.hpp has the formulas and their sources) -------------
  // The experts' own GEMMs are matmul_forward/backward on each expert's rows. These kernels
  // have host bodies here that stage their operands through host memory, so every backend
  // runs them; the CPU backend overrides them to skip the copies.
  // logits (N,E) -> scores (N,E), combine weights (N,K) and the chosen experts, host (N*K),
  // each token's in decreasing score order.
  virtual void moe_router_forward(Tensor& scores, Tensor& weights, std::span<int32_t> experts,
                                  const Tensor& logits, RouterScore score);
  // The load-balancing loss of one micro-batch's tokens (coeff included).
  virtual double moe_aux_loss(const Tensor& scores, std::span<const int32_t> experts, int top_k,
                              RouterScore score, double coeff);
  // dlogits (N,E) overwritten: through the combine weights' gradient dweights (N,K), plus
  // aux_scale times the gradient of the load-balancing loss with coeff 1.
  virtual void moe_router_backward(Tensor& dlogits, const Tensor& dweights, const Tensor& scores,
                                   const Tensor& weights, std::span<const int32_t> experts,
                                   RouterScore score, double aux_scale);
  // The load-balancing loss's sums over these tokens, sums (2E): copies routed to each expert,
  // then each expert's summed probability (moe_math::aux_sums); tensor-parallel ranks add
  // theirs before the loss (moe_math::aux_loss_of) is taken.
  virtual void moe_aux_sums(const Tensor& scores, std::span<const int32_t> experts,
                            RouterScore score, std::span<double> sums);
  // As moe_router_backward, with the loss's gradient given per expert (moe_math::aux_grad of
  // the sums over all the micro-batch's tokens; empty: none).
  virtual void moe_router_backward_aux(Tensor& dlogits, const Tensor& dweights,
                                       const Tensor& scores, const Tensor& weights,
                                       std::span<const int32_t> experts, RouterScore score,
                                       std::span<const double> aux_grad);
  // out (M,C): out[i] = inp[rows[i]] (the permutation: tokens into expert order).
  virtual void gather_rows(Tensor& out, const Tensor& inp, std::span<const int32_t> rows);
  // out (N,C) = sum over k of weights[n,k] * inp[slots[n*K+k]], overwritten; weights (N,K)
  // undefined = ones (the dispatch's backward: the K copies of a token's gradient summed).
  virtual void moe_combine_forward(Tensor& out, const Tensor& inp, const Tensor& weights,
                                   std::span<const int32_t> slots);
  // dinp (M,C): row slots[n*K+k] = weights[n,k] * dout[n]; dweights (N,K) = dout[n] . that
  // row of inp; both overwritten.
  virtual void moe_combine_backward(Tensor& dinp, Tensor& dweights, const Tensor& dout,
                                    const Tensor& inp, const Tensor& weights,
                                    std::span<const int32_t> slots);

  // ---- optimizer --------------------------------------------------------------------------
  virtual double sum_squares(const Tensor& t) = 0;  // in fp64, for the global grad norm
  virtual void scale(Tensor& t, float factor) = 0;
  // In place on param, m, v (all the same numel as grad).
  virtual void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                            const AdamWStep& step) = 0;

 protected:
  // The kernels a backend does not have yet (context parallelism's block attention on CUDA).
  [[noreturn]] void unsupported(const char* kernel) const {
    throw std::logic_error(kernel + std::string(" is not implemented on the ") + name() +
                           " backend yet");
  }
  void progress() const {
    if (progress_) progress_();
  }

 private:
  std::function<void()> progress_;
};

// ---- the host bodies of the MoE kernels (any backend: operands staged through host) --------
namespace backend_detail {
inline std::vector<float> host_copy(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.numel()) be.download(v.data(), t);
  return v;
}
inline void require_rows(const char* kernel, const char* what, const Tensor& t, int64_t cols) {
  if (!t.defined() || t.ndim() < 1 || t.dim(-1) != cols || t.dtype != ScalarType::fp32)
    throw std::invalid_argument(std::string(kernel) + ": " + what + " must be fp32 (...," +
                                std::to_string(cols) + "), got " + t.shape.str());
}
}  // namespace backend_detail

inline void Backend::moe_router_forward(Tensor& scores, Tensor& weights, std::span<int32_t> experts,
                                        const Tensor& logits, RouterScore score) {
  using namespace backend_detail;
  const int64_t E = logits.defined() ? logits.dim(-1) : 0, N = E ? logits.numel() / E : 0;
  const int64_t K = N ? int64_t(experts.size()) / N : 0;
  require_rows("moe_router_forward", "logits", logits, E);
  expect_shape(scores, logits.shape, "moe_router_forward", "scores");
  if (K < 1 || K > E || int64_t(experts.size()) != N * K || weights.numel() != N * K)
    throw std::invalid_argument("moe_router_forward: experts (" + std::to_string(experts.size()) +
                                ") and weights " + weights.shape.str() + " must hold N*K with " +
                                "1 <= K <= E for N = " + std::to_string(N));
  const std::vector<float> l = host_copy(*this, logits);
  std::vector<float> s(l.size()), w(static_cast<size_t>(N * K));
  moe_math::router_forward(l.data(), N, E, int(K), score, s.data(), w.data(), experts.data());
  upload(scores, s.data());
  upload(weights, w.data());
}

inline double Backend::moe_aux_loss(const Tensor& scores, std::span<const int32_t> experts,
                                    int top_k, RouterScore score, double coeff) {
  const int64_t E = scores.dim(-1), N = scores.numel() / E;
  const std::vector<float> s = backend_detail::host_copy(*this, scores);
  return moe_math::aux_loss(s.data(), N, E, experts, top_k, score, coeff);
}

inline void Backend::moe_router_backward(Tensor& dlogits, const Tensor& dweights,
                                         const Tensor& scores, const Tensor& weights,
                                         std::span<const int32_t> experts, RouterScore score,
                                         double aux_scale) {
  const int64_t E = scores.dim(-1), N = scores.numel() / E, K = weights.dim(-1);
  std::vector<double> sums(static_cast<size_t>(2 * E));
  if (aux_scale != 0) moe_aux_sums(scores, experts, score, sums);
  const std::vector<double> a = moe_math::aux_grad(sums.data(), E, double(N), int(K), aux_scale);
  moe_router_backward_aux(dlogits, dweights, scores, weights, experts, score,
                          aux_scale != 0 ? std::span<const double>(a) : std::span<const double>());
}

inline void Backend::moe_aux_sums(const Tensor& scores, std::span<const int32_t> experts,
                                  RouterScore score, std::span<double> sums) {
  const int64_t E = scores.dim(-1), N = scores.numel() / E;
  if (int64_t(sums.size()) != 2 * E)
    throw std::invalid_argument("moe_aux_sums: sums must hold 2 x " + std::to_string(E));
  const std::vector<float> s = backend_detail::host_copy(*this, scores);
  moe_math::aux_sums(s.data(), N, E, experts, score, sums.data());
}

inline void Backend::moe_router_backward_aux(Tensor& dlogits, const Tensor& dweights,
                                             const Tensor& scores, const Tensor& weights,
                                             std::span<const int32_t> experts, RouterScore score,
                                             std::span<const double> aux_grad) {
  using namespace backend_detail;
  const int64_t E = scores.dim(-1), N = scores.numel() / E, K = weights.dim(-1);
  if (!aux_grad.empty() && int64_t(aux_grad.size()) != E)
    throw std::invalid_argument("moe_router_backward: aux_grad must hold " + std::to_string(E));
  expect_shape(dlogits, scores.shape, "moe_router_backward", "dlogits");
  expect_shape(dweights, weights.shape, "moe_router_backward", "dweights");
  if (weights.numel() != N * K || int64_t(experts.size()) != N * K)
    throw std::invalid_argument("moe_router_backward: weights " + weights.shape.str() +
                                " and experts must hold N*K for N = " + std::to_string(N));
  const std::vector<float> dw = host_copy(*this, dweights), s = host_copy(*this, scores),
                           w = host_copy(*this, weights);
  std::vector<float> dl(s.size());
  moe_math::router_backward(dl.data(), dw.data(), s.data(), w.data(), experts, N, E, int(K), score,
                            aux_grad.empty() ? nullptr : aux_grad.data());
  upload(dlogits, dl.data());
}

inline void Backend::gather_rows(Tensor& out, const Tensor& inp, std::span<const int32_t> rows) {
  using namespace backend_detail;
  const int64_t C = inp.defined() ? inp.dim(-1) : 0;
  require_rows("gather_rows", "inp", inp, C);
  if (out.numel() != int64_t(rows.size()) * C)
    throw std::invalid_argument("gather_rows: out " + out.shape.str() + " must hold " +
                                std::to_string(rows.size()) + " rows of " + std::to_string(C));
  if (rows.empty()) return;
  const std::vector<float> x = host_copy(*this, inp);
  std::vector<float> o(static_cast<size_t>(out.numel()));
  moe_math::gather_rows(o.data(), x.data(), C ? inp.numel() / C : 0, C, rows);
  upload(out, o.data());
}

inline void Backend::moe_combine_forward(Tensor& out, const Tensor& inp, const Tensor& weights,
                                         std::span<const int32_t> slots) {
  using namespace backend_detail;
  const int64_t C = out.defined() ? out.dim(-1) : 0, N = C ? out.numel() / C : 0;
  const int64_t K = N ? int64_t(slots.size()) / N : 0;
  require_rows("moe_combine_forward", "inp", inp, C);
  if (int64_t(slots.size()) != N * K || (weights.defined() && weights.numel() != N * K))
    throw std::invalid_argument("moe_combine_forward: slots and weights must hold N*K");
  const std::vector<float> x = host_copy(*this, inp);
  const std::vector<float> w = weights.defined() ? host_copy(*this, weights) : std::vector<float>{};
  std::vector<float> o(static_cast<size_t>(out.numel()));
  moe_math::combine_forward(o.data(), x.data(), inp.numel() / C, w.empty() ? nullptr : w.data(),
                            slots, N, int(K), C);
  if (!o.empty()) upload(out, o.data());
}

inline void Backend::moe_combine_backward(Tensor& dinp, Tensor& dweights, const Tensor& dout,
                                          const Tensor& inp, const Tensor& weights,
                                          std::span<const int32_t> slots) {
  using namespace backend_detail;
  const int64_t C = dout.defined() ? dout.dim(-1) : 0, N = C ? dout.numel() / C : 0;
  const int64_t K = weights.defined() ? weights.dim(-1) : 0;
  require_rows("moe_combine_backward", "inp", inp, C);
  expect_shape(dinp, inp.shape, "moe_combine_backward", "dinp");
  expect_shape(dweights, weights.shape, "moe_combine_backward", "dweights");
  if (int64_t(slots.size()) != N * K || weights.numel() != N * K)
    throw std::invalid_argument("moe_combine_backward: slots and weights must hold N*K");
  const std::vector<float> g = host_copy(*this, dout), x = host_copy(*this, inp),
                           w = host_copy(*this, weights);
  std::vector<float> dx(x.size(), 0.0f), dw(w.size());
  moe_math::combine_backward(dx.data(), dw.data(), g.data(), x.data(), inp.numel() / C, w.data(),
                             slots, N, int(K), C);
  if (!dx.empty()) upload(dinp, dx.data());
  if (!dw.empty()) upload(dweights, dw.data());
}

// The Eigen + OpenMP backend; threads = omp_get_max_threads() at each kernel call.
std::unique_ptr<Backend> make_cpu_backend();

}  // namespace stratagem
