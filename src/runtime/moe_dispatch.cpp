// Expert parallelism's all-to-all dispatch and combine (moe_dispatch.hpp).
#include "stratagem/moe_dispatch.hpp"

#include <numeric>
#include <stdexcept>
#include <string>

namespace stratagem {

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
  x.recv_rows.assign(size_t(P), 0);
  x.local_counts.assign(size_t(L), 0);
  for (int j = 0; j < P; ++j)
    for (int l = 0; l < L; ++l) {
      x.send_rows[size_t(j)] += counts[size_t(j * L + l)];
      x.recv_rows[size_t(j)] += recv[size_t(j * L + l)];
      x.local_counts[size_t(l)] += recv[size_t(j * L + l)];
    }
  // Received rows sit in (source, expert) blocks; the experts read (expert, source) blocks.
  std::vector<int64_t> block_start(size_t(P) * L);
  int64_t at = 0;
  for (size_t b = 0; b < block_start.size(); ++b) block_start[b] = at, at += recv[b];
  x.regroup.reserve(size_t(at));
  for (int l = 0; l < L; ++l)
    for (int i = 0; i < P; ++i) {
      const size_t b = size_t(i) * L + l;
      for (int64_t r = 0; r < recv[b]; ++r) x.regroup.push_back(int32_t(block_start[b] + r));
    }
  x.ungroup.assign(x.regroup.size(), 0);
  for (size_t k = 0; k < x.regroup.size(); ++k) x.ungroup[size_t(x.regroup[k])] = int32_t(k);
  return x;
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
