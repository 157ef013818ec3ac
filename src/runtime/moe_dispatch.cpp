// Expert parallelism's all-to-all dispatch and combine (moe_dispatch.hpp).
#include "stratagem/moe_dispatch.hpp"

#include <numeric>
#include <stdexcept>
#include <string>

namespace stratagem {

namespace {
// Rows received in (member, expert) blocks of sizes blocks[i*L + l]: the rows from each member
// (member_rows), of each expert (expert_rows), and the order the experts read, (expert,
// member): row k of that order is received row regroup[k]; ungroup inverts it.
void lay_out_blocks(const std::vector<int64_t>& blocks, int P, int L,
                    std::vector<int64_t>& member_rows, std::vector<int64_t>& expert_rows,
                    std::vector<int32_t>& regroup, std::vector<int32_t>& ungroup) {
  member_rows.assign(size_t(P), 0);
  expert_rows.assign(size_t(L), 0);
  std::vector<int64_t> block_start(size_t(P) * L);
  int64_t at = 0;
  for (int i = 0; i < P; ++i)
    for (int l = 0; l < L; ++l) {
      const size_t b = size_t(i) * L + l;
      block_start[b] = at;
      at += blocks[b];
      member_rows[size_t(i)] += blocks[b];
      expert_rows[size_t(l)] += blocks[b];
    }
  regroup.clear();
  regroup.reserve(size_t(at));
  for (int l = 0; l < L; ++l)
    for (int i = 0; i < P; ++i) {
      const size_t b = size_t(i) * L + l;
      for (int64_t r = 0; r < blocks[b]; ++r) regroup.push_back(int32_t(block_start[b] + r));
    }
  ungroup.assign(regroup.size(), 0);
  for (size_t k = 0; k < regroup.size(); ++k) ungroup[size_t(regroup[k])] = int32_t(k);
}
}  // namespace

ExpertExchange plan_exchange(Communicator& ep, const std::vector<int64_t>& counts) {
  const int P = ep.size();
  const int64_t E = int64_t(counts.size());
  if (P < 1 || E % P)
    throw std::invalid_argument("plan_exchange: ep " + std::to_string(P) + " does not divide the " +
                                std::to_string(E) + " experts");
  ExpertExchange x;
  x.members = P;
  x.local_experts = int(E / P);
  const int L = x.local_experts;
  // recv[i*L + l]: rows member i sends to this member's held expert l.
  std::vector<int64_t> recv(size_t(P) * L);
  ep.all_to_all_counts(counts.data(), recv.data(), L);
  x.send_rows.assign(size_t(P), 0);
  for (int j = 0; j < P; ++j)
    for (int l = 0; l < L; ++l) x.send_rows[size_t(j)] += counts[size_t(j * L + l)];
  lay_out_blocks(recv, P, L, x.recv_rows, x.local_counts, x.regroup, x.ungroup);
  return x;
}

ExpertGather plan_expert_gather(Communicator& etp, const std::vector<int64_t>& counts) {
  const int P = etp.size();
  const int L = int(counts.size());
  // An all-gather of the counts as an all-to-all of this member's counts sent to every member.
  std::vector<int64_t> send(size_t(P) * L), recv(size_t(P) * L);
  for (int j = 0; j < P; ++j) std::copy(counts.begin(), counts.end(), send.begin() + j * L);
  etp.all_to_all_counts(send.data(), recv.data(), L);
  ExpertGather g;
  lay_out_blocks(recv, P, L, g.member_rows, g.counts, g.regroup, g.ungroup);
  return g;
}

void gather_expert_rows(Backend& be, Communicator& etp, const ExpertGather& g, const Tensor& rows,
                        Tensor& gathered, Tensor& scratch) {
  const int64_t C = rows.dim(-1);
  std::vector<int64_t> counts = g.member_rows;
  int64_t before = 0;
  for (int i = 0; i < etp.rank(); ++i) before += counts[size_t(i)];
  for (int64_t& v : counts) v *= C;
  Tensor mine = scratch.view(Shape{g.gathered(), C}).rows(before, before + rows.dim(0));
  be.copy(mine, rows);
  etp.iall_gather_v_inplace(scratch.data, counts)->wait();
  be.gather_rows(gathered, scratch, g.regroup);
}

void reduce_expert_rows(Backend& be, Communicator& etp, const ExpertGather& g,
                        const Tensor& partial, Tensor& out, Tensor& scratch) {
  const int64_t C = partial.dim(-1);
  be.gather_rows(scratch, partial, g.ungroup);
  std::vector<int64_t> counts = g.member_rows;
  for (int64_t& v : counts) v *= C;
  etp.ireduce_scatter_v(scratch.data, out.data, counts)->wait();
}

void exchange_rows(Communicator& ep, const ExpertExchange& x, const Tensor& send, Tensor& received,
                   bool back) {
  const int64_t C = send.dim(-1);
  std::vector<int64_t> s = back ? x.recv_rows : x.send_rows, r = back ? x.send_rows : x.recv_rows;
  const int64_t send_total = std::accumulate(s.begin(), s.end(), int64_t{0});
  const int64_t recv_total = std::accumulate(r.begin(), r.end(), int64_t{0});
  if (send.numel() != send_total * C || received.numel() != recv_total * C)
    throw std::invalid_argument("exchange_rows: send " + send.shape.str() + " and received " +
                                received.shape.str() + " do not hold " +
                                std::to_string(send_total) + " and " + std::to_string(recv_total) +
                                " rows of " + std::to_string(C));
  for (int64_t& v : s) v *= C;
  for (int64_t& v : r) v *= C;
  ep.iall_to_all_v(send.data, s, received.data, r)->wait();
}

namespace {
Tensor rows_tensor(const MoeActs& a, Backend& be, int64_t rows, int64_t C, bool saved) {
  return saved ? a.save(be, Shape{rows, C}) : a.temp(be, Shape{rows, C});
}
}  // namespace

void moe_forward_ep(Backend& be, Communicator& ep, const TransformerConfig& cfg,
                    const LayerWeights& w, const Tensor& xn, Tensor& y, MoeActs& a,
                    ExpertExchange& x) {
  const int64_t C = xn.dim(-1), N = xn.numel() / C, NK = N * cfg.moe.top_k;
  if (int(w.expert_fc1_w.size()) * ep.size() != cfg.moe.experts)
    throw std::logic_error("moe_forward_ep: this member holds " +
                           std::to_string(w.expert_fc1_w.size()) + " experts, not experts/ep");
  moe_router_forward(be, cfg, w, xn, a);
  Tensor permuted = rows_tensor(a, be, NK, C, false);
  moe_permute_forward(be, xn, a.routing, permuted);
  x = plan_exchange(ep, a.routing.counts);
  const int64_t M = x.received();
  Tensor received = rows_tensor(a, be, M, C, false);
  exchange_rows(ep, x, permuted, received, false);
  permuted = Tensor{};
  a.expert_in = rows_tensor(a, be, M, C, true);
  be.gather_rows(a.expert_in, received, x.regroup);
  a.expert_out = rows_tensor(a, be, M, C, true);
  moe_experts_forward(be, cfg, w, a.expert_in, x.local_counts, a, a.expert_out);
  // Back in (source, expert) order, then home.
  be.gather_rows(received, a.expert_out, x.ungroup);
  a.combined_in = rows_tensor(a, be, NK, C, true);
  exchange_rows(ep, x, received, a.combined_in, true);
  moe_combine_forward(be, a.combined_in, a, y);
  moe_shared_forward(be, cfg, w, xn, a, y);
}

void moe_backward_ep(Backend& be, Communicator& ep, const TransformerConfig& cfg,
                     const LayerWeights& w, LayerWeights& g, const Tensor& dy, const Tensor& xn,
                     const MoeActs& a, const ExpertExchange& x, double aux_scale, Tensor& d_xn) {
  const int64_t C = xn.dim(-1), N = xn.numel() / C, NK = N * cfg.moe.top_k, M = x.received();
  Tensor d_combined = a.temp(be, Shape{NK, C}), d_weights = a.temp(be, a.weights.shape);
  moe_combine_backward(be, dy, a, d_combined, d_weights);
  Tensor received = a.temp(be, Shape{M, C}), d_rows = a.temp(be, Shape{M, C});
  exchange_rows(ep, x, d_combined, received, false);
  be.gather_rows(d_rows, received, x.regroup);
  Tensor d_in = a.temp(be, Shape{M, C});
  moe_experts_backward(be, cfg, w, g, d_rows, a.expert_in, x.local_counts, a, d_in);
  be.gather_rows(received, d_in, x.ungroup);
  exchange_rows(ep, x, received, d_combined, true);  // d_combined now holds d_permuted
  moe_permute_backward(be, d_combined, a.routing, d_xn);
  moe_router_backward(be, cfg, w, g, d_weights, xn, a, aux_scale, d_xn);
  moe_shared_backward(be, cfg, w, g, dy, xn, a, d_xn);
}

}  // namespace stratagem
