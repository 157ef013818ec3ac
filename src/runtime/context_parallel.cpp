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
Tensor take_zeros(Backend& be, const Dims& d, Shape s) {
  Tensor t = take(be, d, s);
  be.fill(t, 0.0f);
  return t;
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

// Block j of `send` goes to member j; block i of `recv` comes from member i.
void all_to_all(Backend& be, Communicator& comm, const Tensor& send, Tensor& recv,
                int64_t block_count) {
  std::vector<RequestPtr> pending;
  const int cp = comm.size(), me = comm.rank();
  for (int j = 0; j < cp; ++j) {
    if (j == me) continue;
    pending.push_back(comm.irecv(recv.data + j * block_count, block_count, j, kA2aTag));
    pending.push_back(comm.isend(send.data + j * block_count, block_count, j, kA2aTag));
  }
  Tensor mine = recv.slice(me * block_count, Shape{block_count});
  be.copy(mine, send.slice(me * block_count, Shape{block_count}));
  for (auto& r : pending) r->wait();
}

// ---- ring ------------------------------------------------------------------------------------
// The ring's cp steps: at step s the rank holds member (rank - s)'s K,V block in `cur` while
// the next block travels into `nxt`; visit(q, block, k) runs for each of the rank's chunks q
// and the block's chunks k that causal attention lets q see, then end_of_step() before the
// step's transfers are awaited.
template <class Visit, class EndOfStep>
void ring_steps(Communicator& comm, const Dims& d, Tensor& cur, Tensor& nxt, Visit visit,
                EndOfStep end_of_step) {
  const CpChunks mine = cp_chunks(d.rank, d.cp, d.seq_len);
  const int next = (d.rank + 1) % d.cp, prev = (d.rank + d.cp - 1) % d.cp;
  const int64_t n = cur.numel();
  for (int s = 0; s < d.cp; ++s) {
    // The next block travels while this one is attended to.
    RequestPtr send, recv;
    if (s + 1 < d.cp) {
      recv = comm.irecv(nxt.data, n, prev, kKvTag);
      send = comm.isend(cur.data, n, next, kKvTag);
    }
    const CpChunks theirs = cp_chunks((d.rank - s + d.cp) % d.cp, d.cp, d.seq_len);
    for (const TokenSpan& q : {mine.first, mine.second})
      for (const TokenSpan& k : {theirs.first, theirs.second})
        if (sees(q, k)) visit(q, cur, k);
    end_of_step();
    if (send) send->wait();
    if (recv) recv->wait();
    std::swap(cur, nxt);
  }
}

void ring_forward(Backend& be, Communicator& comm, const Dims& d, Tensor& out, Tensor& lse,
                  const Tensor& qkv) {
  Tensor cur = pack_kv(be, d, qkv);
  Tensor nxt = take(be, d, cur.shape);
  Tensor part_out = take(be, d, out.shape), part_lse = take(be, d, lse.shape);
  be.fill(out, 0.0f);
  be.fill(lse, -std::numeric_limits<float>::infinity());
  ring_steps(
      comm, d, cur, nxt,
      [&](const TokenSpan& q, const Tensor& kv, const TokenSpan& k) {
        be.attention_block_forward(part_out, part_lse, qkv, q, kv, k, d.heads, d.kv_heads);
        be.attention_merge(out, lse, part_out, part_lse, q);
      },
      [] {});
}

void ring_backward(Backend& be, Communicator& comm, const Dims& d, Tensor& dqkv, const Tensor& dout,
                   const Tensor& out, const Tensor& lse, const Tensor& qkv) {
  const int next = (d.rank + 1) % d.cp, prev = (d.rank + d.cp - 1) % d.cp;
  Tensor cur = pack_kv(be, d, qkv);
  Tensor nxt = take(be, d, cur.shape);
  Tensor dcur = take_zeros(be, d, cur.shape), dnxt = take(be, d, cur.shape);
  be.fill(dqkv, 0.0f);
  const int64_t n = cur.numel();
  ring_steps(
      comm, d, cur, nxt,
      [&](const TokenSpan& q, const Tensor& kv, const TokenSpan& k) {
        be.attention_block_backward(dqkv, dcur, dout, out, lse, qkv, q, kv, k, d.heads, d.kv_heads);
      },
      [&] {
        // The block's dK,dV follow it around the ring; after the last step they reach its
        // owner.
        if (d.cp == 1) return;
        RequestPtr drecv = comm.irecv(dnxt.data, n, prev, kDkvTag);
        RequestPtr dsend = comm.isend(dcur.data, n, next, kDkvTag);
        dsend->wait();
        drecv->wait();
        std::swap(dcur, dnxt);
      });
  be.copy_block(dqkv, 0, d.k_col(), dcur, 0, 0, d.batch * d.local_rows, d.kv_width());
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

// K,V of the whole sequence in position order (B, T, 2*KV*hd): each rank's own block packed
// into its place, gathered in place, permuted in place (through `held`, one chunk of rows).
Tensor gather_kv(Backend& be, Communicator& comm, const Dims& d, const Tensor& qkv, Tensor& held) {
  const Shape block{d.batch, d.local_rows, d.kv_width()};
  Tensor blocks = take(be, d, Shape{d.cp * d.batch, d.local_rows, d.kv_width()});
  Tensor mine = member_block(blocks, d.rank, block);
  be.copy_block(mine, 0, 0, qkv, 0, d.k_col(), d.batch * d.local_rows, d.kv_width());
  comm.iall_gather_v_inplace(blocks.data, std::vector<int64_t>(size_t(d.cp), block.numel()))
      ->wait();
  permute_chunks(be, d, blocks, held, d.kv_width(), /*to_sequence=*/true);
  return blocks.view(Shape{d.batch, d.seq_len, d.kv_width()});
}

void allgather_forward(Backend& be, Communicator& comm, const Dims& d, Tensor& out, Tensor& lse,
                       const Tensor& qkv) {
  Tensor held = take(be, d, Shape{d.local_rows / 2, d.kv_width()});
  const Tensor kv = gather_kv(be, comm, d, qkv, held);
  const CpChunks mine = cp_chunks(d.rank, d.cp, d.seq_len);
  const TokenSpan all{0, d.seq_len, 0};
  for (const TokenSpan& q : {mine.first, mine.second})
    be.attention_block_forward(out, lse, qkv, q, kv, all, d.heads, d.kv_heads);
}

void allgather_backward(Backend& be, Communicator& comm, const Dims& d, Tensor& dqkv,
                        const Tensor& dout, const Tensor& out, const Tensor& lse,
                        const Tensor& qkv) {
  // Gathered again rather than kept: a whole sequence of K,V per layer would outweigh the
  // rank's own activations.
  // The Program's two gathered-sized buffers (CpComm) and nothing more: each permutation
  // holds its chunk in the other tensor's memory, where nothing is yet (or any more).
  const Shape whole{d.batch, d.seq_len, d.kv_width()};
  const Shape chunk{d.local_rows / 2, d.kv_width()};
  Tensor dkv = take(be, d, whole);
  Tensor held = dkv.slice(0, chunk);
  Tensor kv = gather_kv(be, comm, d, qkv, held);
  be.fill(dkv, 0.0f);
  be.fill(dqkv, 0.0f);
  const CpChunks mine = cp_chunks(d.rank, d.cp, d.seq_len);
  const TokenSpan all{0, d.seq_len, 0};
  for (const TokenSpan& q : {mine.first, mine.second})
    be.attention_block_backward(dqkv, dkv, dout, out, lse, qkv, q, kv, all, d.heads, d.kv_heads);
  Tensor held_back = kv.slice(0, chunk);
  permute_chunks(be, d, dkv, held_back, d.kv_width(), /*to_sequence=*/false);
  // The gathered K,V are done with: their memory receives the rank's summed block.
  Tensor mine_dkv = kv.slice(0, Shape{d.batch, d.local_rows, d.kv_width()});
  comm.ireduce_scatter(dkv.data, mine_dkv.data, mine_dkv.numel())->wait();
  be.copy_block(dqkv, 0, d.k_col(), mine_dkv, 0, 0, d.batch * d.local_rows, d.kv_width());
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

// The working memory is the Program's (iteration.hpp's CpComm): one qkv-sized and one
// output-sized tensor; the exchanges reuse what each step is done with, and the layer's own
// tensors where they are about to be rewritten.
void a2a_forward(Backend& be, Communicator& comm, const Dims& d, Tensor& out, Tensor& lse,
                 Tensor& qkv) {
  const HeadGroup g = head_group(d);
  const int64_t ow = g.heads * d.head_dim;
  auto qkv_of = [&](int j) { return qkv_pieces(d, g, j); };
  auto out_of = [&](int j) { return out_pieces(d, g, j); };
  Tensor send = take(be, d, Shape{d.cp * d.batch, d.local_rows, g.width});
  pack_groups(be, d, send, qkv, g.width, qkv_of);
  Tensor recv = qkv.view(send.shape);  // packed: the local q, k, v are free to receive
  all_to_all(be, comm, send, recv, d.batch * d.local_rows * g.width);
  Tensor seq = send.view(Shape{d.batch, d.seq_len, g.width});
  blocks_to_sequence(be, d, seq, recv, g.width);
  Tensor seq_out = take(be, d, Shape{d.batch, d.seq_len, ow});
  Tensor seq_lse = lse.view(Shape{d.batch, g.heads, d.seq_len});
  Tensor no_att;
  be.attention_forward(seq_out, no_att, seq_lse, seq, g.heads, g.kv_heads);
  // The backward attends the same whole-sequence head group: kept in qkv's place (the same
  // size) instead of traded again.
  be.copy(qkv, seq);
  Tensor send_out = send.slice(0, Shape{d.cp * d.batch, d.local_rows, ow});
  sequence_to_blocks(be, d, send_out, seq_out, ow);
  Tensor recv_out = seq_out.view(send_out.shape);
  all_to_all(be, comm, send_out, recv_out, d.batch * d.local_rows * ow);
  unpack_groups(be, d, out, recv_out, ow, out_of);
}

void a2a_backward(Backend& be, Communicator& comm, const Dims& d, Tensor& dqkv, const Tensor& dout,
                  const Tensor& out, const Tensor& lse, const Tensor& qkv) {
  const HeadGroup g = head_group(d);
  const int64_t ow = g.heads * d.head_dim;
  auto qkv_of = [&](int j) { return qkv_pieces(d, g, j); };
  auto out_of = [&](int j) { return out_pieces(d, g, j); };
  const Shape out_blocks{d.cp * d.batch, d.local_rows, ow};
  const int64_t out_count = d.batch * d.local_rows * ow,
                qkv_count = d.batch * d.local_rows * g.width;
  Tensor a = take(be, d, out_blocks);
  Tensor x = take(be, d, Shape{d.cp * d.batch, d.local_rows, g.width});
  Tensor x_out = x.slice(0, out_blocks);
  // The output, then its gradient, over the whole sequence for this head group (the latter
  // received in dqkv's memory, which is written last).
  pack_groups(be, d, a, out, ow, out_of);
  all_to_all(be, comm, a, x_out, out_count);
  Tensor seq_out = a.view(Shape{d.batch, d.seq_len, ow});
  blocks_to_sequence(be, d, seq_out, x_out, ow);
  pack_groups(be, d, x_out, dout, ow, out_of);
  Tensor d_recv = dqkv.slice(0, out_blocks);
  all_to_all(be, comm, x_out, d_recv, out_count);
  Tensor seq_dout = x_out.view(Shape{d.batch, d.seq_len, ow});
  blocks_to_sequence(be, d, seq_dout, d_recv, ow);
  const Tensor seq = qkv.view(Shape{d.batch, d.seq_len, g.width});
  const Tensor seq_lse = lse.view(Shape{d.batch, g.heads, d.seq_len});
  Tensor seq_dqkv = dqkv.view(seq.shape);
  be.attention_backward(seq_dqkv, seq_dout, seq_out, seq, Tensor{}, seq_lse, g.heads, g.kv_heads);
  // dQ, dK, dV back to the rows' owners, then into the local layout of all heads.
  sequence_to_blocks(be, d, x, seq_dqkv, g.width);
  Tensor back = dqkv.view(x.shape);
  all_to_all(be, comm, x, back, qkv_count);
  be.copy(x, back);
  unpack_groups(be, d, dqkv, x, g.width, qkv_of);
}

}  // namespace

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

void cp_attention_forward(Backend& be, Communicator& comm, const CpAttention& a, Tensor& out,
                          Tensor& lse, Tensor& qkv) {
  const Dims d = dims_of(comm, a, qkv, "cp_attention_forward");
  expect_shape(out, Shape{d.batch, d.local_rows, d.heads * d.head_dim}, "cp_attention_forward",
               "out");
  expect_shape(lse, Shape{d.batch, d.heads, d.local_rows}, "cp_attention_forward", "lse");
  switch (a.kind) {
    case CpKind::ring:
      return ring_forward(be, comm, d, out, lse, qkv);
    case CpKind::allgather:
      return allgather_forward(be, comm, d, out, lse, qkv);
    case CpKind::a2a:
      return a2a_forward(be, comm, d, out, lse, qkv);
  }
}

void cp_attention_backward(Backend& be, Communicator& comm, const CpAttention& a, Tensor& dqkv,
                           const Tensor& dout, const Tensor& out, const Tensor& lse,
                           const Tensor& qkv) {
  const Dims d = dims_of(comm, a, dqkv, "cp_attention_backward");
  expect_shape(dout, Shape{d.batch, d.local_rows, d.heads * d.head_dim}, "cp_attention_backward",
               "dout");
  expect_shape(out, dout.shape, "cp_attention_backward", "out");
  checks::expect_numel("cp_attention_backward", "lse", lse, d.batch * d.heads * d.local_rows);
  checks::expect_numel("cp_attention_backward", "qkv", qkv, dqkv.numel());
  switch (a.kind) {
    case CpKind::ring:
      return ring_backward(be, comm, d, dqkv, dout, out, lse, qkv);
    case CpKind::allgather:
      return allgather_backward(be, comm, d, dqkv, dout, out, lse, qkv);
    case CpKind::a2a:
      return a2a_backward(be, comm, d, dqkv, dout, out, lse, qkv);
  }
}

CpAttention cp_attention(const TransformerConfig& c, const SequenceShare& seq) {
  if (!seq.comm || seq.comm->size() != seq.cp || seq.comm->rank() != seq.cp_rank)
    throw std::logic_error("context parallelism: the cp communicator does not match cp " +
                           std::to_string(seq.cp) + " rank " + std::to_string(seq.cp_rank));
  return CpAttention{seq.kind, c.heads, c.kv_heads, seq.seq_len, seq.scratch};
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
