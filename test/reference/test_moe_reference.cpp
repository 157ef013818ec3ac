// One Mixture-of-Experts FFN (router, top-k, permutation, SwiGLU or GELU experts, weighted
// combine, shared experts, load-balancing loss) on the CPU backend against an independent
// PyTorch implementation in float64 (moe_reference.py): the output, the aux loss, the top-k
// choices and the gradients of the input, the router and every expert weight.
#define BOOST_TEST_MODULE moe_reference
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "stratagem/moe_block.hpp"
#include "test/reference/h5_min.hpp"
#include "test/support/fp32_bounds.hpp"

using namespace stratagem;
using namespace stratagem::test;
namespace fs = std::filesystem;

#ifndef STRATAGEM_PYTHON
#define STRATAGEM_PYTHON "/usr/bin/python3"
#endif

namespace {

struct Case {
  std::string name;
  RouterScore score = RouterScore::softmax;
  Activation activation = Activation::swiglu;
  int experts = 4, top_k = 2, shared = 0;
  double aux_coeff = 0.01;
  bool aux_only = false;  // dy = 0: the router's gradient is the load-balancing loss's alone
};

constexpr int64_t kTokens = 48, kHidden = 32, kExpertFfn = 24;

struct Block {
  TransformerConfig cfg;
  LayerWeights w, g;
  Tensor x, dy;
};

Tensor randn(Backend& be, Shape s, float sd, std::mt19937& rng) {
  Tensor t = be.allocate(s);
  std::normal_distribution<float> d(0.0f, sd);
  for (int64_t i = 0; i < t.numel(); ++i) t.data[i] = d(rng);
  return t;
}

Block make_block(Backend& be, const Case& c) {
  Block b;
  b.cfg.hidden = int(kHidden);
  b.cfg.activation = c.activation;
  b.cfg.moe.experts = c.experts;
  b.cfg.moe.top_k = c.top_k;
  b.cfg.moe.expert_ffn_hidden = int(kExpertFfn);
  b.cfg.moe.shared_experts = c.shared;
  b.cfg.moe.router_score = c.score;
  b.cfg.moe.aux_loss_coeff = c.aux_coeff;
  std::mt19937 rng(2024);
  const int64_t F1 = b.cfg.fc1_rows(int(kExpertFfn));
  // Large enough router weights that the routing is far from uniform (the aux loss and the
  // combine weights then carry real gradients).
  b.w.router_w = randn(be, Shape{c.experts, kHidden}, 0.5f, rng);
  b.g.router_w = be.zeros(b.w.router_w.shape);
  for (int e = 0; e < c.experts; ++e) {
    b.w.expert_fc1_w.push_back(randn(be, Shape{F1, kHidden}, 0.2f, rng));
    b.w.expert_fc2_w.push_back(randn(be, Shape{kHidden, kExpertFfn}, 0.2f, rng));
    b.g.expert_fc1_w.push_back(be.zeros(Shape{F1, kHidden}));
    b.g.expert_fc2_w.push_back(be.zeros(Shape{kHidden, kExpertFfn}));
  }
  if (c.shared) {
    const int64_t Fs = c.shared * kExpertFfn;
    b.w.shared_fc1_w = randn(be, Shape{b.cfg.fc1_rows(int(Fs)), kHidden}, 0.2f, rng);
    b.w.shared_fc2_w = randn(be, Shape{kHidden, Fs}, 0.2f, rng);
    b.g.shared_fc1_w = be.zeros(b.w.shared_fc1_w.shape);
    b.g.shared_fc2_w = be.zeros(b.w.shared_fc2_w.shape);
  }
  b.x = randn(be, Shape{kTokens, kHidden}, 1.0f, rng);
  b.dy = randn(be, Shape{kTokens, kHidden}, 1.0f, rng);
  if (c.aux_only) be.fill(b.dy, 0.0f);
  return b;
}

// The gap between each token's K-th and (K+1)-th score: the reference picks the same experts
// only when no two scores are closer than the fp32 scores' error (~1e-7), so the data must
// keep them apart.
double smallest_topk_gap(const MoeActs& a, int K) {
  double gap = 1e30;
  const int64_t E = a.scores.dim(1);
  for (int64_t n = 0; n < a.scores.dim(0); ++n) {
    std::vector<float> s(a.scores.data + n * E, a.scores.data + (n + 1) * E);
    std::sort(s.begin(), s.end(), std::greater<float>());
    if (K < E) gap = std::min(gap, double(s[size_t(K - 1)] - s[size_t(K)]));
    for (int k = 0; k + 1 < K; ++k) gap = std::min(gap, double(s[size_t(k)] - s[size_t(k + 1)]));
  }
  return gap;
}

// Writes the tensor in the reference's shape (experts stacked).
void write_stack(hid_t f, const std::string& name, const std::vector<Tensor>& ts) {
  std::vector<float> all;
  for (const Tensor& t : ts) all.insert(all.end(), t.data, t.data + t.numel());
  write_dataset(f, name, H5T_NATIVE_FLOAT, all.data(),
                {hsize_t(ts.size()), hsize_t(ts[0].dim(0)), hsize_t(ts[0].dim(1))});
}
void write_tensor(hid_t f, const std::string& name, const Tensor& t) {
  write_dataset(f, name, H5T_NATIVE_FLOAT, t.data, {hsize_t(t.dim(0)), hsize_t(t.dim(1))});
}

// Max-norm error relative to the reference tensor's largest entry.
double rel_error(const float* got, const std::vector<double>& ref) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(double(got[i]) - ref[i]));
    mag = std::max(mag, std::abs(ref[i]));
  }
  return mag > 0 ? err / mag : err;
}
std::vector<float> stacked(const std::vector<Tensor>& ts) {
  std::vector<float> all;
  for (const Tensor& t : ts) all.insert(all.end(), t.data, t.data + t.numel());
  return all;
}

void check_case(const Case& c) {
  auto be = make_cpu_backend();
  Block b = make_block(*be, c);
  MoeActs acts;
  Tensor y = be->allocate(b.x.shape), dx = be->allocate(b.x.shape);
  moe_forward(*be, b.cfg, b.w, b.x, y, acts);
  moe_backward(*be, b.cfg, b.w, b.g, b.dy, b.x, acts, 1.0, dx);
  BOOST_REQUIRE_MESSAGE(smallest_topk_gap(acts, c.top_k) > 1e-5,
                        c.name << ": test data has near-tied router scores");

  const fs::path dir =
      fs::temp_directory_path() / ("stratagem-moe-ref-" + std::to_string(::getpid()) + c.name);
  fs::create_directories(dir);
  const fs::path in = dir / "in.h5", out = dir / "out.h5";
  {
    const hid_t f = H5Fcreate(in.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    BOOST_REQUIRE(f >= 0);
    const nlohmann::json config = {{"experts", c.experts},
                                   {"top_k", c.top_k},
                                   {"router_score", to_string(c.score)},
                                   {"activation", to_string(c.activation)},
                                   {"aux_loss_coeff", c.aux_coeff},
                                   {"shared", c.shared > 0}};
    write_string_attr(f, "config", config.dump());
    write_tensor(f, "x", b.x);
    write_tensor(f, "dy", b.dy);
    write_tensor(f, "router", b.w.router_w);
    write_stack(f, "fc1", b.w.expert_fc1_w);
    write_stack(f, "fc2", b.w.expert_fc2_w);
    if (c.shared) {
      write_tensor(f, "shared_fc1", b.w.shared_fc1_w);
      write_tensor(f, "shared_fc2", b.w.shared_fc2_w);
    }
    H5Fclose(f);
  }
  const std::string cmd = std::string(STRATAGEM_PYTHON) + " \"" + STRATAGEM_SOURCE_DIR +
                          "/test/reference/moe_reference.py\" \"" + in.string() + "\" \"" +
                          out.string() + "\"";
  BOOST_REQUIRE_MESSAGE(std::system(cmd.c_str()) == 0, "moe_reference.py failed: " << cmd);
  const hid_t f = H5Fopen(out.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  BOOST_REQUIRE(f >= 0);

  const std::vector<double> ref_experts = read_doubles(f, "experts");
  size_t same = 0;
  for (size_t i = 0; i < ref_experts.size(); ++i)
    same += acts.routing.chosen[i] == int32_t(ref_experts[i]);
  BOOST_TEST(same == ref_experts.size(), c.name << ": top-k choices differ");

  const double aux = read_doubles(f, "aux").at(0);
  // fp32 against the float64 reference: the block's rounding (fp32_bounds.hpp).
  const double bound =
      stratagem::test::moe_block_rtol(kHidden, c.experts, c.top_k, kExpertFfn, kTokens);
  BOOST_TEST(std::abs(acts.aux_loss - aux) <= bound * std::abs(aux),
             c.name << ": aux " << acts.aux_loss << " vs " << aux);
  if (c.aux_coeff > 0) BOOST_TEST(aux > 0);

  struct Cmp {
    const char* name;
    std::vector<float> got;
  };
  std::vector<Cmp> cmps = {
      {"y", std::vector<float>(y.data, y.data + y.numel())},
      {"grads/x", std::vector<float>(dx.data, dx.data + dx.numel())},
      {"grads/router",
       std::vector<float>(b.g.router_w.data, b.g.router_w.data + b.g.router_w.numel())},
      {"grads/fc1", stacked(b.g.expert_fc1_w)},
      {"grads/fc2", stacked(b.g.expert_fc2_w)}};
  if (c.shared) {
    cmps.push_back({"grads/shared_fc1", stacked({b.g.shared_fc1_w})});
    cmps.push_back({"grads/shared_fc2", stacked({b.g.shared_fc2_w})});
  }
  for (Cmp& cmp : cmps) {
    const std::vector<double> ref = read_doubles(f, cmp.name);
    BOOST_REQUIRE_EQUAL(ref.size(), cmp.got.size());
    const double err = rel_error(cmp.got.data(), ref);
    BOOST_TEST(err <= bound,
               c.name << " " << cmp.name << ": relative error " << err << ", bound " << bound);
    BOOST_TEST_MESSAGE(c.name << " " << cmp.name << ": relative error " << err);
    // The comparison can fail: a change of one entry by 1e-4 of the largest is caught.
    double mag = 0;
    for (double r : ref) mag = std::max(mag, std::abs(r));
    if (mag == 0) continue;  // an expert's gradient under aux_only
    cmp.got[cmp.got.size() / 2] += float(1e-4 * mag);
    BOOST_TEST(rel_error(cmp.got.data(), ref) > bound);
  }
  H5Fclose(f);
  fs::remove_all(dir);
}

}  // namespace

BOOST_AUTO_TEST_CASE(softmax_top2_swiglu_shared) {
  check_case(Case{"softmax_top2", RouterScore::softmax, Activation::swiglu, 4, 2, 1, 0.01});
}

BOOST_AUTO_TEST_CASE(sigmoid_top2_swiglu) {
  check_case(Case{"sigmoid_top2", RouterScore::sigmoid, Activation::swiglu, 8, 2, 0, 0.01});
}

BOOST_AUTO_TEST_CASE(softmax_top1_gelu) {
  check_case(Case{"softmax_top1", RouterScore::softmax, Activation::gelu, 4, 1, 0, 0.1});
}

BOOST_AUTO_TEST_CASE(sigmoid_top3_no_aux) {
  check_case(Case{"sigmoid_top3", RouterScore::sigmoid, Activation::swiglu, 6, 3, 2, 0.0});
}

BOOST_AUTO_TEST_CASE(aux_loss_gradient_alone) {
  check_case(Case{"aux_softmax", RouterScore::softmax, Activation::swiglu, 4, 2, 0, 0.5, true});
  check_case(Case{"aux_sigmoid", RouterScore::sigmoid, Activation::swiglu, 4, 2, 0, 0.5, true});
}
