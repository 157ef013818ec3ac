// Expert parallelism's all-to-all dispatch and combine (moe_dispatch.hpp) against the FFN on a
// rank that holds every expert: under `mpirun -np P` the world is one ep group, each member
// holding experts/P experts and routing its own tokens. Each member's output and input
// gradient equal the whole FFN's on its tokens; its experts' weight gradients equal the sum over
// members of the whole FFN's gradients of those experts; the router's and shared experts' equal
// the member's own. Expert tensor parallelism (the world as one expert_tp group, each member
// holding a 1/P shard of every expert: fc1 by rows of each of its gate and up halves, fc2 by
// columns): rows all-gathered, the sharded GEMMs, the partial sums reduce-scattered back equal
// the whole experts on the member's own rows, forward and backward.
#define BOOST_TEST_MODULE moe_ep
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "stratagem/moe_dispatch.hpp"
#include "test/support/fp32_bounds.hpp"
#include "test/support/serial_executor.hpp"

using namespace stratagem;
using MpiSession = stratagem::test::MpiSession;
BOOST_GLOBAL_FIXTURE(MpiSession);

namespace {

constexpr int64_t kTokens = 40, kHidden = 32, kExpertFfn = 24;

Tensor randn(Backend& be, Shape s, float sd, std::mt19937& rng) {
  Tensor t = be.allocate(s);
  std::normal_distribution<float> d(0.0f, sd);
  for (int64_t i = 0; i < t.numel(); ++i) t.data[i] = d(rng);
  return t;
}

double rel_error(const Tensor& got, const std::vector<float>& ref) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(double(got.data[i]) - ref[i]));
    mag = std::max(mag, std::abs(double(ref[i])));
  }
  return mag > 0 ? err / mag : err;
}
std::vector<float> values(const Tensor& t) {
  return std::vector<float>(t.data, t.data + t.numel());
}

struct Member {
  int rank = 0, size = 1;
};
Member member() {
  Member m;
  MPI_Comm_rank(MPI_COMM_WORLD, &m.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &m.size);
  return m;
}
TransformerConfig swiglu_config() {
  TransformerConfig cfg;
  cfg.hidden = int(kHidden);
  cfg.activation = Activation::swiglu;
  return cfg;
}
// The worst relative error seen, and where.
struct Worst {
  double error = 0;
  std::string where;
  void note(const std::string& name, double e) {
    if (e >= error) error = e, where = name;
  }
};

void check(RouterScore score, int experts, int top_k, int shared) {
  const auto [rank, size] = member();
  auto ep = make_mpi_communicator(MPI_COMM_WORLD, "ep");
  auto be = make_cpu_backend();
  TransformerConfig cfg = swiglu_config();
  cfg.moe.experts = experts;
  cfg.moe.top_k = top_k;
  cfg.moe.expert_ffn_hidden = int(kExpertFfn);
  cfg.moe.shared_experts = shared;
  cfg.moe.router_score = score;
  cfg.moe.aux_loss_coeff = 0.05;
  // The same weights on every member, different tokens.
  std::mt19937 rng(7);
  LayerWeights whole, whole_g;
  whole.router_w = randn(*be, Shape{experts, kHidden}, 0.5f, rng);
  whole_g.router_w = be->zeros(whole.router_w.shape);
  for (int e = 0; e < experts; ++e) {
    whole.expert_fc1_w.push_back(randn(*be, Shape{2 * kExpertFfn, kHidden}, 0.2f, rng));
    whole.expert_fc2_w.push_back(randn(*be, Shape{kHidden, kExpertFfn}, 0.2f, rng));
    whole_g.expert_fc1_w.push_back(be->zeros(Shape{2 * kExpertFfn, kHidden}));
    whole_g.expert_fc2_w.push_back(be->zeros(Shape{kHidden, kExpertFfn}));
  }
  if (shared) {
    whole.shared_fc1_w = randn(*be, Shape{2 * shared * kExpertFfn, kHidden}, 0.2f, rng);
    whole.shared_fc2_w = randn(*be, Shape{kHidden, shared * kExpertFfn}, 0.2f, rng);
    whole_g.shared_fc1_w = be->zeros(whole.shared_fc1_w.shape);
    whole_g.shared_fc2_w = be->zeros(whole.shared_fc2_w.shape);
  }
  std::mt19937 mine(100 + rank);
  const Tensor x = randn(*be, Shape{kTokens, kHidden}, 1.0f, mine);
  const Tensor dy = randn(*be, Shape{kTokens, kHidden}, 1.0f, mine);

  // The whole FFN on this member's tokens.
  MoeActs ref_acts;
  Tensor y_ref = be->allocate(x.shape), dx_ref = be->allocate(x.shape);
  moe_forward(*be, cfg, whole, x, y_ref, ref_acts);
  moe_backward(*be, cfg, whole, whole_g, dy, x, ref_acts, 1.0, dx_ref);

  // This member's experts only.
  const int L = experts / size;
  LayerWeights w, g;
  w.router_w = whole.router_w;
  g.router_w = be->zeros(whole.router_w.shape);
  w.first_expert = g.first_expert = rank * L;
  for (int e = rank * L; e < (rank + 1) * L; ++e) {
    w.expert_fc1_w.push_back(whole.expert_fc1_w[size_t(e)]);
    w.expert_fc2_w.push_back(whole.expert_fc2_w[size_t(e)]);
    g.expert_fc1_w.push_back(be->zeros(whole.expert_fc1_w[0].shape));
    g.expert_fc2_w.push_back(be->zeros(whole.expert_fc2_w[0].shape));
  }
  w.shared_fc1_w = whole.shared_fc1_w, w.shared_fc2_w = whole.shared_fc2_w;
  if (shared) g.shared_fc1_w = be->zeros(w.shared_fc1_w.shape);
  if (shared) g.shared_fc2_w = be->zeros(w.shared_fc2_w.shape);
  MoeActs acts;
  ExpertExchange xch;
  Tensor y = be->allocate(x.shape), dx = be->allocate(x.shape);
  moe_forward_ep(*be, *ep, cfg, w, x, y, acts, xch);
  moe_backward_ep(*be, *ep, cfg, w, g, dy, x, acts, xch, 1.0, dx);

  Worst worst;
  worst.note("y", rel_error(y, values(y_ref)));
  worst.note("d_x", rel_error(dx, values(dx_ref)));
  worst.note("router", rel_error(g.router_w, values(whole_g.router_w)));
  if (shared) worst.note("shared_fc1", rel_error(g.shared_fc1_w, values(whole_g.shared_fc1_w)));
  // The load-balancing loss sums over every member's tokens and the experts.
  BOOST_TEST(std::abs(acts.aux_loss - ref_acts.aux_loss) <=
             stratagem::test::reductions_rtol({kTokens * size, experts}) *
                 std::abs(ref_acts.aux_loss));
  // Every member's tokens reach the experts: their gradients sum over the members.
  for (int e = 0; e < experts; ++e) {
    for (Tensor* t : {&whole_g.expert_fc1_w[size_t(e)], &whole_g.expert_fc2_w[size_t(e)]})
      MPI_Allreduce(MPI_IN_PLACE, t->data, int(t->numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  int64_t held_rows = 0;
  for (int l = 0; l < L; ++l) {
    const int e = rank * L + l;
    worst.note("expert " + std::to_string(e) + " fc1",
               rel_error(g.expert_fc1_w[size_t(l)], values(whole_g.expert_fc1_w[size_t(e)])));
    worst.note("expert " + std::to_string(e) + " fc2",
               rel_error(g.expert_fc2_w[size_t(l)], values(whole_g.expert_fc2_w[size_t(e)])));
    held_rows += xch.local_counts[size_t(l)];
  }
  // The block's rounding (fp32_bounds.hpp), its weight gradients summed over every member's
  // tokens.
  const double bound =
      stratagem::test::moe_block_rtol(kHidden, experts, top_k, kExpertFfn, kTokens * size);
  BOOST_TEST(worst.error <= bound, "rank " << rank << ": worst " << worst.where << " "
                                           << worst.error << ", bound " << bound);
  BOOST_TEST_MESSAGE("rank " << rank << " (ep " << size << "): " << held_rows
                             << " rows at its experts, worst relative error " << worst.error
                             << " in " << worst.where);
  // Tokens really crossed members: every row reached its expert's holder.
  int64_t total = held_rows, sent = kTokens * top_k;
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &sent, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  BOOST_TEST(total == sent);
  if (size > 1) BOOST_TEST(xch.send_rows[size_t(rank)] < kTokens * top_k);
}

// Rows [r*f, (r+1)*f) of each half of a (2F, C) gate|up weight, or columns [r*f, ...) of a
// (C, F) one.
Tensor shard_of(Backend& be, const Tensor& whole, int r, int P, bool fc1) {
  const int64_t F = fc1 ? whole.dim(0) / 2 : whole.dim(1), f = F / P, C = fc1 ? whole.dim(1) : 0;
  Tensor t = be.allocate(fc1 ? Shape{2 * f, C} : Shape{whole.dim(0), f});
  for (int64_t i = 0; i < t.dim(0); ++i)
    for (int64_t j = 0; j < t.dim(1); ++j)
      t.data[i * t.dim(1) + j] =
          fc1 ? whole.data[((i / f) * F + r * f + i % f) * C + j] : whole.data[i * F + r * f + j];
  return t;
}

}  // namespace

BOOST_AUTO_TEST_CASE(expert_tensor_parallel) {
  const auto [rank, size] = member();
  auto etp = make_mpi_communicator(MPI_COMM_WORLD, "expert_tp");
  auto be = make_cpu_backend();
  TransformerConfig cfg = swiglu_config();
  const int E = 4;
  std::mt19937 rng(11);  // the same experts on every member
  LayerWeights whole, whole_g, w, g;
  for (int e = 0; e < E; ++e) {
    whole.expert_fc1_w.push_back(randn(*be, Shape{2 * kExpertFfn, kHidden}, 0.2f, rng));
    whole.expert_fc2_w.push_back(randn(*be, Shape{kHidden, kExpertFfn}, 0.2f, rng));
    whole_g.expert_fc1_w.push_back(be->zeros(whole.expert_fc1_w.back().shape));
    whole_g.expert_fc2_w.push_back(be->zeros(whole.expert_fc2_w.back().shape));
    w.expert_fc1_w.push_back(shard_of(*be, whole.expert_fc1_w.back(), rank, size, true));
    w.expert_fc2_w.push_back(shard_of(*be, whole.expert_fc2_w.back(), rank, size, false));
    g.expert_fc1_w.push_back(be->zeros(w.expert_fc1_w.back().shape));
    g.expert_fc2_w.push_back(be->zeros(w.expert_fc2_w.back().shape));
  }
  // Each member's own rows, a different number per expert (one expert without any).
  std::mt19937 mine(200 + rank);
  std::vector<int64_t> counts(E);
  int64_t M = 0;
  for (int e = 0; e < E; ++e) M += counts[size_t(e)] = e == rank % E ? 0 : 1 + mine() % 9;
  const Tensor x = randn(*be, Shape{M, kHidden}, 1.0f, mine);
  const Tensor dy = randn(*be, Shape{M, kHidden}, 1.0f, mine);
  MoeActs ref;
  Tensor y_ref = be->allocate(x.shape), dx_ref = be->allocate(x.shape);
  moe_experts_forward(*be, cfg, whole, x, counts, ref, y_ref);
  moe_experts_backward(*be, cfg, whole, whole_g, dy, x, counts, ref, dx_ref);

  const ExpertGather gat = plan_expert_gather(*etp, counts);
  const int64_t G = gat.gathered();
  Tensor scratch = be->allocate(Shape{G, kHidden}), in = be->allocate(Shape{G, kHidden});
  Tensor partial = be->allocate(Shape{G, kHidden}), d_out = be->allocate(Shape{G, kHidden});
  Tensor y = be->allocate(x.shape), dx = be->allocate(x.shape);
  MoeActs acts;
  gather_expert_rows(*be, *etp, gat, x, in, scratch);
  moe_experts_forward(*be, cfg, w, in, gat.counts, acts, partial);
  reduce_expert_rows(*be, *etp, gat, partial, y, scratch);
  gather_expert_rows(*be, *etp, gat, dy, d_out, scratch);
  moe_experts_backward(*be, cfg, w, g, d_out, in, gat.counts, acts, partial);
  reduce_expert_rows(*be, *etp, gat, partial, dx, scratch);

  Worst worst;
  worst.note("y", rel_error(y, values(y_ref)));
  worst.note("d_x", rel_error(dx, values(dx_ref)));
  // Every member's rows reach every shard: the shards' gradients are the members' sum, cut.
  for (int e = 0; e < E; ++e) {
    for (Tensor* t : {&whole_g.expert_fc1_w[size_t(e)], &whole_g.expert_fc2_w[size_t(e)]})
      MPI_Allreduce(MPI_IN_PLACE, t->data, int(t->numel()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    const Tensor c1 = shard_of(*be, whole_g.expert_fc1_w[size_t(e)], rank, size, true);
    const Tensor c2 = shard_of(*be, whole_g.expert_fc2_w[size_t(e)], rank, size, false);
    worst.note("expert " + std::to_string(e) + " fc1",
               rel_error(g.expert_fc1_w[size_t(e)], values(c1)));
    worst.note("expert " + std::to_string(e) + " fc2",
               rel_error(g.expert_fc2_w[size_t(e)], values(c2)));
  }
  // The experts' part of the block, with every member's rows (M summed below) in the gradients.
  int64_t all_rows = M;
  MPI_Allreduce(MPI_IN_PLACE, &all_rows, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  const double bound = stratagem::test::moe_block_rtol(kHidden, E, 1, kExpertFfn, all_rows);
  BOOST_TEST(worst.error <= bound, "rank " << rank << ": worst " << worst.where << " "
                                           << worst.error << ", bound " << bound);
  int64_t rows = M;
  MPI_Allreduce(MPI_IN_PLACE, &rows, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  BOOST_TEST(G == rows);  // every member's rows were gathered
  BOOST_TEST_MESSAGE("rank " << rank << " (etp " << size << "): " << M << " own rows of " << G
                             << ", worst relative error " << worst.error << " in " << worst.where);
}

BOOST_AUTO_TEST_CASE(softmax_top2_shared) {
  check(RouterScore::softmax, 8, 2, 1);
}

BOOST_AUTO_TEST_CASE(sigmoid_top3) {
  check(RouterScore::sigmoid, 8, 3, 0);
}
