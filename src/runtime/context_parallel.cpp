// Context-parallel attention over a cp group: the ring, all-gather and all-to-all kinds
// (context_parallel.hpp), assembled from the Backend's block attention, online-softmax merge
// and block copies, and the Communicator's point-to-point transfers and collectives.
#include "src/runtime/context_parallel.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "src/runtime/kernel_checks.hpp"

namespace stratagem {
namespace {

// Distinct tags: on a cp group of 2 the next and the previous rank are the same peer.
constexpr int kKvTag = 2701, kDkvTag = 2702, kA2aTag = 2703;

// The sizes every kind needs, from the rank's local (B, T/cp, (NH+2KV)*hd) tensor.
struct Dims {
  int64_t batch = 0;       // B
  int64_t local_rows = 0;  // T / cp: the rank's rows of each sequence
  int64_t qkv_width = 0;   // (NH + 2 KV) hd
  int64_t head_dim = 0;    // hd
  int64_t seq_len = 0;     // T
  int cp = 1, rank = 0, heads = 0, kv_heads = 0;
  const CpScratch* scratch = nullptr;  // where the working tensors come from (empty: allocate)
  int64_t kv_width() const { return 2 * kv_heads * head_dim; }
  int64_t k_col() const { return heads * head_dim; }  // first k column of a qkv row
};

Dims dims_of(const Communicator& comm, const CpAttention& a, const Tensor& local,
             const char* where) {
  Dims d;
  d.scratch = &a.scratch;
  d.cp = comm.size(), d.rank = comm.rank(), d.heads = a.heads, d.kv_heads = a.kv_heads;
  d.seq_len = a.seq_len;
  const int64_t width = static_cast<int64_t>(a.heads) + 2 * a.kv_heads;
  if (!local.defined() || local.ndim() != 3 || a.heads <= 0 || a.kv_heads <= 0 ||
      local.dim(2) % width != 0)
    throw std::invalid_argument(std::string(where) + ": qkv must be (B,T/cp,(NH+2KV)*hd), got " +
                                local.shape.str());
  d.batch = local.dim(0), d.local_rows = local.dim(1), d.qkv_width = local.dim(2),
  d.head_dim = d.qkv_width / width;
  if (d.local_rows * d.cp != d.seq_len)
    throw std::invalid_argument(std::string(where) + ": " + std::to_string(d.local_rows) +
                                " local rows on " + std::to_string(d.cp) +
                                " ranks do not make the sequence of " + std::to_string(d.seq_len));
  cp_chunks(d.rank, d.cp, d.seq_len);  // checks that 2 cp divides T
  return d;
}

// A working tensor of the attention (uninitialized), from the caller's scratch.
Tensor take(Backend& be, const Dims& d, Shape s) {
  return d.scratch && *d.scratch ? (*d.scratch)(s) : be.allocate(s);
}

// Member i's block of a buffer holding one block per member.
Tensor member_block(const Tensor& buf, int i, Shape block) {
  return buf.slice(static_cast<int64_t>(i) * block.numel(), block);
}

// K and V of the local rows, packed as (B, T/cp, 2*KV*hd): what travels between ranks.
Tensor pack_kv(Backend& be, const Dims& d, const Tensor& qkv) {
  Tensor kv = take(be, d, Shape{d.batch, d.local_rows, d.kv_width()});
  be.copy_block(kv, 0, 0, qkv, 0, d.k_col(), d.batch * d.local_rows, d.kv_width());
  return kv;
}

// What a tensor's transfer moves (the runtime computes in fp32).
int64_t bytes_of(const Tensor& t) {
  return t.numel() * int64_t(sizeof(float));
}

bool sees(TokenSpan q, TokenSpan k) {
  return k.rows > 0 && q.rows > 0 && k.pos0 <= q.pos0 + q.rows - 1;
}

// Rows in local chunk order (B, T/cp, X) of every member, one block each in `blocks`, to or
// from the whole sequence in position order (B, T, X).
void blocks_to_sequence(Backend& be, const Dims& d, Tensor& seq, const Tensor& blocks,
                        int64_t width) {
  for (int i = 0; i < d.cp; ++i) {
    const Tensor block = member_block(blocks, i, Shape{d.batch, d.local_rows, width});
    const CpChunks ch = cp_chunks(i, d.cp, d.seq_len);
    for (int64_t b = 0; b < d.batch; ++b)
      for (const TokenSpan& s : {ch.first, ch.second})
        be.copy_block(seq, b * d.seq_len + s.pos0, 0, block, b * d.local_rows + s.row0, 0, s.rows,
                      width);
  }
}
void sequence_to_blocks(Backend& be, const Dims& d, Tensor& blocks, const Tensor& seq,
                        int64_t width) {
  for (int i = 0; i < d.cp; ++i) {
    Tensor block = member_block(blocks, i, Shape{d.batch, d.local_rows, width});
    const CpChunks ch = cp_chunks(i, d.cp, d.seq_len);
    for (int64_t b = 0; b < d.batch; ++b)
      for (const TokenSpan& s : {ch.first, ch.second})
        be.copy_block(block, b * d.local_rows + s.row0, 0, seq, b * d.seq_len + s.pos0, 0, s.rows,
                      width);
  }
}

// Block j of `send` goes to member j, block i of `recv` comes from member i: the pairs in
// flight as one request; the rank's own block is copied now.
RequestPtr all_to_all(Backend& be, Communicator& comm, const Tensor& send, Tensor& recv,
                      int64_t block_count) {
  auto group = std::make_unique<RequestGroup>();
  const int cp = comm.size(), me = comm.rank();
  for (int j = 0; j < cp; ++j) {
    if (j == me) continue;
    group->parts.push_back(comm.irecv(recv.data + j * block_count, block_count, j, kA2aTag));
    group->parts.push_back(comm.isend(send.data + j * block_count, block_count, j, kA2aTag));
  }
  Tensor mine = recv.slice(me * block_count, Shape{block_count});
  be.copy(mine, send.slice(me * block_count, Shape{block_count}));
  return group;
}

// ---- all-gather ------------------------------------------------------------------------------
// The gathered blocks (member-major: member i's B x T/cp rows, chunk i then 2 cp - 1 - i) and
// the sequence order (B, T) hold the same chunk records of T / (2 cp) rows: one order is
// permuted into the other in place, along the permutation's cycles through one record `held`
// (c x width, outside buf), so that the gathered K,V take no second copy.
void permute_chunks(Backend& be, const Dims& d, Tensor& buf, Tensor& held, int64_t width,
                    bool to_sequence) {
  const int64_t c = d.local_rows / 2, records = int64_t(d.cp) * d.batch * 2;
  std::vector<int64_t> source(static_cast<size_t>(records));  // position <- the record it takes
  for (int i = 0; i < d.cp; ++i)
    for (int64_t b = 0; b < d.batch; ++b)
      for (int h = 0; h < 2; ++h) {
        const int64_t member = (i * d.batch + b) * 2 + h;
        const int64_t chunk = h == 0 ? i : 2 * d.cp - 1 - i;
        const int64_t sequence = b * 2 * d.cp + chunk;
        if (to_sequence)
          source[size_t(sequence)] = member;
        else
          source[size_t(member)] = sequence;
      }
  std::vector<bool> done(static_cast<size_t>(records), false);
  for (int64_t start = 0; start < records; ++start) {
    if (done[size_t(start)] || source[size_t(start)] == start) continue;
    be.copy_block(held, 0, 0, buf, start * c, 0, c, width);
    int64_t at = start;
    while (source[size_t(at)] != start) {
      be.copy_block(buf, at * c, 0, buf, source[size_t(at)] * c, 0, c, width);
      done[size_t(at)] = true;
      at = source[size_t(at)];
    }
    be.copy_block(buf, at * c, 0, held, 0, 0, c, width);
    done[size_t(at)] = true;
  }
}

// ---- all-to-all (Ulysses) --------------------------------------------------------------------
struct HeadGroup {
  int heads, kv_heads;
  int64_t width;  // (heads + 2 kv_heads) * hd
};
HeadGroup head_group(const Dims& d) {
  if (d.heads % d.cp != 0 || d.kv_heads % d.cp != 0)
    throw std::invalid_argument("cp a2a: heads (" + std::to_string(d.heads) + ") and kv_heads (" +
                                std::to_string(d.kv_heads) + ") must divide by cp (" +
                                std::to_string(d.cp) + ")");
  const int h = d.heads / d.cp, kv = d.kv_heads / d.cp;
  return {h, kv, (static_cast<int64_t>(h) + 2 * kv) * d.head_dim};
}

// The columns of head group j in a row: its q, k and v heads (a qkv row), or its heads alone
// (an output row: one piece).
struct Pieces {
  int64_t col[3], width[3];
};
Pieces qkv_pieces(const Dims& d, const HeadGroup& g, int j) {
  const int64_t qw = g.heads * d.head_dim, kw = g.kv_heads * d.head_dim;
  return {{j * qw, d.k_col() + j * kw, d.k_col() + d.kv_heads * d.head_dim + j * kw}, {qw, kw, kw}};
}
Pieces out_pieces(const Dims& d, const HeadGroup& g, int j) {
  const int64_t ow = g.heads * d.head_dim;
  return {{j * ow, 0, 0}, {ow, 0, 0}};
}

// Local rows of all heads <-> one block per head group (member-major (cp*B, T/cp, width)).
template <class PiecesOf>
void pack_groups(Backend& be, const Dims& d, Tensor& blocks, const Tensor& local, int64_t width,
                 PiecesOf pieces) {
  for (int j = 0; j < d.cp; ++j) {
    Tensor block = member_block(blocks, j, Shape{d.batch, d.local_rows, width});
    const Pieces p = pieces(j);
    for (int k = 0, at = 0; k < 3; at += int(p.width[k]), ++k)
      if (p.width[k] > 0)
        be.copy_block(block, 0, at, local, 0, p.col[k], d.batch * d.local_rows, p.width[k]);
  }
}
template <class PiecesOf>
void unpack_groups(Backend& be, const Dims& d, Tensor& local, const Tensor& blocks, int64_t width,
                   PiecesOf pieces) {
  for (int j = 0; j < d.cp; ++j) {
    const Tensor block = member_block(blocks, j, Shape{d.batch, d.local_rows, width});
    const Pieces p = pieces(j);
    for (int k = 0, at = 0; k < 3; at += int(p.width[k]), ++k)
      if (p.width[k] > 0)
        be.copy_block(local, 0, p.col[k], block, 0, at, d.batch * d.local_rows, p.width[k]);
  }
}

}  // namespace

// ---- the pass ----------------------------------------------------------------------------------
// What every kind keeps between its ops. Ring: the two K,V blocks (step j's is kv[j % 2]); forward
// the partial output and log-sum-exp of a block, backward the dK,dV a step sends (dkv_send) and
// the accumulator it receives (dkv_recv). All-gather: the gathered K,V (whole: the sequence
// order; backward also the whole dK,dV and the rank's summed block). a2a: the head-split copies.
struct CpPass::State {
  State(Backend& backend, Communicator& group, const CpAttention& a, bool bwd, const Tensors& ts)
      : be(backend),
        comm(group),
        scratch(a.scratch),
        d(dims_of(group, a, ts.qkv, "CpPass")),
        kind(a.kind),
        backward(bwd),
        t(ts) {
    d.scratch = &scratch;
  }
  Backend& be;
  Communicator& comm;
  CpScratch scratch;  // Dims::scratch points here
  Dims d;
  CpKind kind;
  bool backward;
  Tensors t;
  Tensor kv[2], part_out, part_lse, dkv_send, dkv_recv;  // ring
  Tensor gathered, whole_dkv, mine_dkv;                  // all-gather
  Tensor send, seq_out;                                  // a2a
  HeadGroup g{};
  int next() const { return (d.rank + 1) % d.cp; }
  int prev() const { return (d.rank + d.cp - 1) % d.cp; }
  Shape kv_block() const { return Shape{d.batch, d.local_rows, d.kv_width()}; }
  Shape out_blocks() const { return Shape{d.cp * d.batch, d.local_rows, g.heads * d.head_dim}; }
  Shape qkv_blocks() const { return Shape{d.cp * d.batch, d.local_rows, g.width}; }
  void ring_core(int step);
  void gather_core();
  void a2a_core();
};

CpPass::CpPass(Backend& be, Communicator& comm, const CpAttention& a, bool backward,
               const Tensors& t)
    : s_(std::make_unique<State>(be, comm, a, backward, t)) {
  State& s = *s_;
  const Dims& d = s.d;
  const Shape out{d.batch, d.local_rows, d.heads * d.head_dim};
  expect_shape(t.out, out, "CpPass", "out");
  checks::expect_numel("CpPass", "lse", t.lse, d.batch * d.heads * d.local_rows);
  if (backward) {
    expect_shape(t.dout, out, "CpPass", "dout");
    checks::expect_numel("CpPass", "dqkv", t.dqkv, t.qkv.numel());
  }
  if (s.kind == CpKind::a2a) {
    s.g = head_group(d);
    // (A forward whose activations go, as under full recompute, keeps no head-group output.)
    if (backward || t.out_heads.defined())
      checks::expect_numel("CpPass", "out_heads", t.out_heads, t.out.numel());
  }
  if (s.kind != CpKind::ring) return;
  s.kv[0] = pack_kv(be, d, t.qkv);
  s.kv[1] = take(be, d, s.kv[0].shape);
  if (backward) {
    s.dkv_send = take(be, d, s.kv[0].shape);
    s.dkv_recv = take(be, d, s.kv[0].shape);
    be.fill(s.t.dqkv, 0.0f);
  } else {
    s.part_out = take(be, d, t.out.shape);
    s.part_lse = take(be, d, t.lse.shape);
    be.fill(s.t.out, 0.0f);
    be.fill(s.t.lse, -std::numeric_limits<float>::infinity());
  }
}

CpPass::~CpPass() = default;

// ---- ring ------------------------------------------------------------------------------------
CpTransfer CpPass::send_kv(int step) {
  State& s = *s_;
  const Tensor& at_hand = s.kv[step % 2];
  return {s.comm.isend(at_hand.data, at_hand.numel(), s.next(), kKvTag), bytes_of(at_hand)};
}

CpTransfer CpPass::recv_kv(int step) {
  State& s = *s_;
  Tensor& arriving = s.kv[(step + 1) % 2];
  return {s.comm.irecv(arriving.data, arriving.numel(), s.prev(), kKvTag), bytes_of(arriving)};
}

CpTransfer CpPass::send_dkv(int step) {
  State& s = *s_;
  // The accumulator received at step - 1 is the same block's: it joins this step's share.
  if (step > 0) s.be.residual_forward(s.dkv_send, s.dkv_send, s.dkv_recv);
  return {s.comm.isend(s.dkv_send.data, s.dkv_send.numel(), s.next(), kDkvTag),
          bytes_of(s.dkv_send)};
}

CpTransfer CpPass::recv_dkv(int) {
  State& s = *s_;
  return {s.comm.irecv(s.dkv_recv.data, s.dkv_recv.numel(), s.prev(), kDkvTag),
          bytes_of(s.dkv_recv)};
}

// At step j the rank holds member (rank - j)'s K,V block: each of its query chunks attends to
// the block's chunks that causal attention lets it see.
void CpPass::State::ring_core(int step) {
  const CpChunks mine = cp_chunks(d.rank, d.cp, d.seq_len);
  const CpChunks theirs = cp_chunks((d.rank - step + d.cp) % d.cp, d.cp, d.seq_len);
  const Tensor& block = kv[step % 2];
  if (backward) be.fill(dkv_send, 0.0f);
  for (const TokenSpan& q : {mine.first, mine.second})
    for (const TokenSpan& k : {theirs.first, theirs.second}) {
      if (!sees(q, k)) continue;
      if (backward) {
        be.attention_block_backward(t.dqkv, dkv_send, t.dout, t.out, t.lse, t.qkv, q, block, k,
                                    d.heads, d.kv_heads);
      } else {
        be.attention_block_forward(part_out, part_lse, t.qkv, q, block, k, d.heads, d.kv_heads);
        be.attention_merge(t.out, t.lse, part_out, part_lse, q);
      }
    }
}

// ---- all-gather ------------------------------------------------------------------------------
// The gathered K,V: each rank's own block packed into its place and gathered in place (member
// order; the core permutes it into the sequence's). Backward gathers again rather than keep
// them: a whole sequence of K,V per layer would outweigh the rank's own activations.
CpTransfer CpPass::before() {
  State& s = *s_;
  const Dims& d = s.d;
  if (s.kind == CpKind::allgather) {
    // Backward: the Program's two gathered-sized buffers (CpComm), the whole dK,dV first, where
    // the permutation holds its chunk before anything is there.
    if (s.backward) s.whole_dkv = take(s.be, d, Shape{d.batch, d.seq_len, d.kv_width()});
    s.gathered = take(s.be, d, Shape{d.cp * d.batch, d.local_rows, d.kv_width()});
    Tensor mine = member_block(s.gathered, d.rank, s.kv_block());
    s.be.copy_block(mine, 0, 0, s.t.qkv, 0, d.k_col(), d.batch * d.local_rows, d.kv_width());
    return {s.comm.iall_gather_v_inplace(s.gathered.data,
                                         std::vector<int64_t>(size_t(d.cp), s.kv_block().numel())),
            bytes_of(s.gathered)};
  }
  if (s.kind != CpKind::a2a) return {};
  if (!s.backward) {
    // Q, K, V by head group; received into qkv's place (packed, it is free).
    s.send = take(s.be, d, s.qkv_blocks());
    pack_groups(s.be, d, s.send, s.t.qkv, s.g.width, [&](int j) { return qkv_pieces(d, s.g, j); });
    Tensor recv = s.t.qkv.view(s.send.shape);
    return {all_to_all(s.be, s.comm, s.send, recv, d.batch * d.local_rows * s.g.width),
            bytes_of(s.send)};
  }
  // The output's gradient by head group, received in dqkv's memory (written last).
  s.send = take(s.be, d, s.qkv_blocks());
  Tensor packed = s.send.slice(0, s.out_blocks());
  pack_groups(s.be, d, packed, s.t.dout, s.g.heads * d.head_dim,
              [&](int j) { return out_pieces(d, s.g, j); });
  Tensor recv = s.t.dqkv.slice(0, s.out_blocks());
  return {all_to_all(s.be, s.comm, packed, recv, d.batch * d.local_rows * s.g.heads * d.head_dim),
          bytes_of(packed)};
}

void CpPass::State::gather_core() {
  const Shape chunk{d.local_rows / 2, d.kv_width()};
  // The permutation's chunk: in the whole dK,dV's memory, where nothing is yet (backward).
  Tensor held = backward ? whole_dkv.slice(0, chunk) : take(be, d, chunk);
  permute_chunks(be, d, gathered, held, d.kv_width(), /*to_sequence=*/true);
  const Tensor kv = gathered.view(Shape{d.batch, d.seq_len, d.kv_width()});
  const CpChunks mine = cp_chunks(d.rank, d.cp, d.seq_len);
  const TokenSpan all{0, d.seq_len, 0};
  if (!backward) {
    for (const TokenSpan& q : {mine.first, mine.second})
      be.attention_block_forward(t.out, t.lse, t.qkv, q, kv, all, d.heads, d.kv_heads);
    return;
  }
  be.fill(whole_dkv, 0.0f);
  be.fill(t.dqkv, 0.0f);
  for (const TokenSpan& q : {mine.first, mine.second})
    be.attention_block_backward(t.dqkv, whole_dkv, t.dout, t.out, t.lse, t.qkv, q, kv, all, d.heads,
                                d.kv_heads);
  Tensor held_back = gathered.slice(0, chunk);  // the gathered K,V are done with
  permute_chunks(be, d, whole_dkv, held_back, d.kv_width(), /*to_sequence=*/false);
}

// ---- all-to-all (Ulysses) --------------------------------------------------------------------
// The working memory is the Program's (iteration.hpp's CpComm): one qkv-sized and one
// output-sized tensor; the exchanges reuse what each step is done with, and the layer's own
// tensors where they are about to be rewritten.
void CpPass::State::a2a_core() {
  const int64_t ow = g.heads * d.head_dim;
  if (!backward) {
    Tensor seq = send.view(Shape{d.batch, d.seq_len, g.width});
    blocks_to_sequence(be, d, seq, t.qkv.view(send.shape), g.width);
    seq_out = take(be, d, Shape{d.batch, d.seq_len, ow});
    Tensor seq_lse = t.lse.view(Shape{d.batch, g.heads, d.seq_len});
    Tensor no_att;
    be.attention_forward(seq_out, no_att, seq_lse, seq, g.heads, g.kv_heads);
    // The backward attends the same head group: kept in qkv's place (the same size), and its
    // output beside the rows' own.
    be.copy(t.qkv, seq);
    if (t.out_heads.defined()) be.copy(t.out_heads, seq_out.view(t.out_heads.shape));
    Tensor send_out = send.slice(0, out_blocks());
    sequence_to_blocks(be, d, send_out, seq_out, ow);
    return;
  }
  // The output's gradient over the whole sequence, out of dqkv's memory, which the core then
  // writes.
  Tensor seq_dout = take(be, d, Shape{d.batch, d.seq_len, ow});
  blocks_to_sequence(be, d, seq_dout, t.dqkv.slice(0, out_blocks()), ow);
  const Tensor seq = t.qkv.view(Shape{d.batch, d.seq_len, g.width});
  const Tensor seq_lse = t.lse.view(Shape{d.batch, g.heads, d.seq_len});
  Tensor seq_dqkv = t.dqkv.view(seq.shape);
  be.attention_backward(seq_dqkv, seq_dout, t.out_heads.view(seq_dout.shape), seq, Tensor{},
                        seq_lse, g.heads, g.kv_heads);
  // dQ, dK, dV back to the rows' owners (after), then into the local layout of all heads.
  sequence_to_blocks(be, d, send, seq_dqkv, g.width);
}

CpTransfer CpPass::after() {
  State& s = *s_;
  const Dims& d = s.d;
  if (s.kind == CpKind::allgather && s.backward) {
    // The gathered K,V are done with: their memory receives the rank's summed block.
    s.mine_dkv = s.gathered.slice(0, s.kv_block());
    return {s.comm.ireduce_scatter(s.whole_dkv.data, s.mine_dkv.data, s.mine_dkv.numel()),
            bytes_of(s.whole_dkv)};
  }
  if (s.kind != CpKind::a2a) return {};
  if (!s.backward) {
    Tensor send_out = s.send.slice(0, s.out_blocks());
    Tensor recv_out = s.seq_out.view(send_out.shape);
    return {all_to_all(s.be, s.comm, send_out, recv_out,
                       d.batch * d.local_rows * s.g.heads * d.head_dim),
            bytes_of(send_out)};
  }
  Tensor back = s.t.dqkv.view(s.send.shape);
  return {all_to_all(s.be, s.comm, s.send, back, d.batch * d.local_rows * s.g.width),
          bytes_of(s.send)};
}

void CpPass::core(int step) {
  switch (s_->kind) {
    case CpKind::ring:
      return s_->ring_core(step);
    case CpKind::allgather:
      return s_->gather_core();
    case CpKind::a2a:
      return s_->a2a_core();
  }
}

void CpPass::finish() {
  State& s = *s_;
  const Dims& d = s.d;
  if (s.kind == CpKind::a2a) {
    if (!s.backward) {
      const Tensor recv_out = s.seq_out.view(s.out_blocks());
      unpack_groups(s.be, d, s.t.out, recv_out, s.g.heads * d.head_dim,
                    [&](int j) { return out_pieces(d, s.g, j); });
      return;
    }
    const Tensor back = s.t.dqkv.view(s.send.shape);
    s.be.copy(s.send, back);
    unpack_groups(s.be, d, s.t.dqkv, s.send, s.g.width,
                  [&](int j) { return qkv_pieces(d, s.g, j); });
    return;
  }
  if (!s.backward) return;
  // The sum of the dK,dV of the rank's own block: the ring's last accumulator, or the
  // all-gather's reduce-scattered block.
  const Tensor& own = s.kind == CpKind::ring ? s.dkv_recv : s.mine_dkv;
  s.be.copy_block(s.t.dqkv, 0, d.k_col(), own, 0, 0, d.batch * d.local_rows, d.kv_width());
}

CpChunks cp_chunks(int rank, int cp, int64_t seq_len) {
  if (cp < 1 || rank < 0 || rank >= cp || seq_len % (2 * cp) != 0)
    throw std::invalid_argument("context parallelism: the sequence of " + std::to_string(seq_len) +
                                " tokens does not split into 2 x cp = " + std::to_string(2 * cp) +
                                " equal chunks");
  const int64_t c = seq_len / (2 * cp);
  return {TokenSpan{0, c, rank * c}, TokenSpan{c, c, (2 * cp - 1 - rank) * c}};
}

std::vector<int64_t> cp_positions(int rank, int cp, int64_t seq_len) {
  const CpChunks ch = cp_chunks(rank, cp, seq_len);
  std::vector<int64_t> pos;
  pos.reserve(static_cast<size_t>(2 * ch.first.rows));
  for (const TokenSpan& s : {ch.first, ch.second})
    for (int64_t i = 0; i < s.rows; ++i) pos.push_back(s.pos0 + i);
  return pos;
}

CpAttention cp_attention(const TransformerConfig& c, const SequenceShare& seq, CpScratch scratch) {
  if (!seq.comm || seq.comm->size() != seq.cp || seq.comm->rank() != seq.cp_rank)
    throw std::logic_error("context parallelism: the cp communicator does not match cp " +
                           std::to_string(seq.cp) + " rank " + std::to_string(seq.cp_rank));
  return CpAttention{seq.kind, c.heads, c.kv_heads, seq.seq_len, std::move(scratch)};
}

namespace {
// Calls fn(b, chunk, first local row) for every sample and chunk of the rank's rows.
template <class Fn>
void for_each_chunk(const SequenceShare& seq, int64_t B, Fn fn) {
  const CpChunks ch = cp_chunks(seq.cp_rank, seq.cp, seq.seq_len);
  const int64_t Tl = seq.seq_len / seq.cp;
  for (int64_t b = 0; b < B; ++b)
    for (const TokenSpan& s : {ch.first, ch.second}) fn(s, b * Tl + s.row0);
}
int64_t local_rows(const SequenceShare& seq, const Tensor& t, const char* where) {
  if (!t.defined() || t.ndim() != 3 || t.dim(1) * seq.cp != seq.seq_len)
    throw std::invalid_argument(std::string(where) + ": expected (B," +
                                std::to_string(seq.seq_len / std::max(seq.cp, 1)) +
                                ",...) rows, got " + t.shape.str());
  return t.dim(0);
}
}  // namespace

void cp_rope(Backend& be, const SequenceShare& seq, Tensor& qkv, const TransformerConfig& c,
             bool backward) {
  const int64_t B = local_rows(seq, qkv, "cp_rope");
  const int64_t W = qkv.dim(2);
  for_each_chunk(seq, B, [&](const TokenSpan& s, int64_t row) {
    Tensor chunk = qkv.slice(row * W, Shape{1, s.rows, W});
    if (backward)
      be.rope_backward_from(chunk, c.heads, c.kv_heads, c.rope_theta, s.pos0);
    else
      be.rope_forward_from(chunk, c.heads, c.kv_heads, c.rope_theta, s.pos0);
  });
}

void cp_embedding_forward(Backend& be, const SequenceShare& seq, Tensor& x_out,
                          std::span<const int32_t> ids, const Tensor& wte, const Tensor& wpe) {
  const int64_t B = local_rows(seq, x_out, "cp_embedding_forward");
  const int64_t C = x_out.dim(2);
  for_each_chunk(seq, B, [&](const TokenSpan& s, int64_t row) {
    Tensor x = x_out.slice(row * C, Shape{1, s.rows, C});
    be.embedding_forward(x, ids.subspan(static_cast<size_t>(row), static_cast<size_t>(s.rows)), wte,
                         wpe.rows(s.pos0, s.pos0 + s.rows));
  });
}

void cp_embedding_backward(Backend& be, const SequenceShare& seq, Tensor& dwte, Tensor& dwpe,
                           std::span<const int32_t> ids, const Tensor& dx) {
  const int64_t B = local_rows(seq, dx, "cp_embedding_backward");
  const int64_t C = dx.dim(2);
  for_each_chunk(seq, B, [&](const TokenSpan& s, int64_t row) {
    Tensor dpos = dwpe.rows(s.pos0, s.pos0 + s.rows);
    be.embedding_backward(dwte, dpos,
                          ids.subspan(static_cast<size_t>(row), static_cast<size_t>(s.rows)),
                          dx.slice(row * C, Shape{1, s.rows, C}));
  });
}

}  // namespace stratagem
