// The whole Transformer on the CPU backend: model-level finite-difference gradients, micro-batch
// accumulation, recompute modes, the parameter table, deterministic init, the optimizer and
// the LR schedule.
#define BOOST_TEST_MODULE transformer_grad
#include <omp.h>

#include <algorithm>
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <random>
#include <vector>

#include "stratagem/error.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/transformer.hpp"
#include "test/support/serial_executor.hpp"

using namespace stratagem;
using stratagem::test::FixedSamples;
using stratagem::test::SerialExecutor;

using MpiSession = stratagem::test::MpiSession;
BOOST_GLOBAL_FIXTURE(MpiSession);

namespace {

ModelSpec tiny_spec(bool llama) {
  ModelSpec s;
  s.name = llama ? "tiny-llama" : "tiny-gpt2";
  s.layers = 2;
  s.hidden = 16;
  s.heads = 4;
  s.kv_heads = llama ? 2 : 4;
  s.ffn_hidden = llama ? 24 : 64;
  s.vocab = 23;
  s.seq_len = 9;
  if (llama) {
    s.norm = Norm::rmsnorm;
    s.activation = Activation::swiglu;
    s.position = Position::rope;
    s.tied_embeddings = false;
    s.bias = false;
  }
  return s;
}

struct Data {
  std::vector<int32_t> tokens, targets;
  Data(int n, int vocab, unsigned seed) : tokens(n), targets(n) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> d(0, vocab - 1);
    for (auto& t : tokens) t = d(rng);
    for (auto& t : targets) t = d(rng);
  }
  FixedSamples samples() const { return FixedSamples(tokens, targets); }
};

// The last stage of a two-stage pipeline: layer 1 (and the head, when asked).
ModelPart stage_part(bool head) {
  ModelPart p;
  p.first_layer = 1;
  p.end_layer = 2;
  p.embedding = false;
  p.head = head;
  return p;
}

std::vector<float> to_vec(const Tensor& t) {
  return {t.data, t.data + t.numel()};
}

double rel_maxnorm(const std::vector<float>& a, const std::vector<float>& ref) {
  double err = 0, mag = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, double(std::abs(a[i] - ref[i])));
    mag = std::max(mag, double(std::abs(ref[i])));
  }
  return mag > 0 ? err / mag : err;
}

// The executor with gradients only (no optimizer step), over batch d.
ExecutorOptions grads_only() {
  ExecutorOptions o;
  o.update = false;
  return o;
}

// Gradients of the batch-mean loss with `micro_batches` and `mode`, from initial weights
// `params` (the model's flat buffer).
std::pair<float, std::vector<float>> grads_of(Backend& be, const ModelSpec& s,
                                              const std::vector<float>& params, const Data& d,
                                              int B, int micro_batches, Recompute mode) {
  SerialExecutor run(s, be, B, B / micro_batches, mode, d.samples(), grads_only());
  std::copy(params.begin(), params.end(), run.model().params.data);
  const float loss = run.ex->step(0).loss;
  return {loss, to_vec(run.model().grads)};
}

}  // namespace

BOOST_AUTO_TEST_CASE(param_table_matches_the_spec) {
  for (bool llama : {false, true}) {
    const ModelSpec s = tiny_spec(llama);
    const TransformerConfig c = transformer_config(s);
    const ParamTable t = make_param_table(c);
    BOOST_TEST(t.size() == s.parameters());
    int64_t offset = 0;
    for (const ParamInfo& e : t.entries()) {
      BOOST_TEST(e.offset == offset);
      offset += e.numel();
    }
    BOOST_TEST(t.entries().front().name == "wte");
    BOOST_TEST((t.at("layers.1.attn.qkv.weight").shape ==
                Shape{(s.heads + 2 * c.kv_heads) * c.head_dim, s.hidden}));
    BOOST_TEST((t.find("wpe") != nullptr) == !llama);
    BOOST_TEST((t.find("lm_head.weight") != nullptr) == llama);
    BOOST_TEST((t.find("layers.0.attn.qkv.bias") != nullptr) == !llama);
    BOOST_TEST((t.find("norm_f.bias") != nullptr) == !llama);
    BOOST_TEST(t.at("layers.0.mlp.fc1.weight").shape[0] == (llama ? 2 : 1) * s.ffn_hidden);
    BOOST_CHECK_THROW(t.at("nope"), std::out_of_range);
    // Spans cover a shard exactly and decay only 2-D tensors.
    const auto spans = t.spans(10, t.size() - 5);
    int64_t covered = 0;
    for (const ParamSpan& sp : spans) covered += sp.numel;
    BOOST_TEST(covered == t.size() - 15);
    BOOST_TEST(spans.front().decay);  // inside wte
  }
  // A pipeline stage: layer 1 and the head of a tied model holds its own wte.
  const TransformerConfig c = transformer_config(tiny_spec(false));
  const ParamTable last = make_param_table(c, stage_part(true));
  BOOST_TEST(last.find("wte") != nullptr);
  BOOST_TEST(last.find("wpe") == nullptr);
  BOOST_TEST(last.find("layers.0.attn.qkv.weight") == nullptr);
  BOOST_TEST(last.find("layers.1.attn.qkv.weight") != nullptr);
}

BOOST_AUTO_TEST_CASE(config_rejects_what_the_runtime_cannot_run) {
  ModelSpec s = tiny_spec(false);
  s.arch = Arch::encoder;
  BOOST_CHECK_THROW(transformer_config(s), NotSupported);
  s = tiny_spec(true);
  s.kv_heads = 3;
  BOOST_CHECK_THROW(transformer_config(s), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(init_is_deterministic_and_gpt2_scaled) {
  auto be = make_cpu_backend();
  ModelSpec s = tiny_spec(false);
  s.hidden = 64;
  s.vocab = 500;
  const TransformerConfig c = transformer_config(s);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  Model one = make_model(*be, c, 42);
  omp_set_num_threads(std::max(2, threads));
  Model many = make_model(*be, c, 42);
  omp_set_num_threads(threads);
  BOOST_TEST((to_vec(one.params) == to_vec(many.params)));
  Model other = make_model(*be, c, 43);
  BOOST_TEST((to_vec(other.params) != to_vec(one.params)));
  // A stage holding only layer 1 gets the full model's layer 1.
  Model stage = make_model(*be, c, 42, stage_part(false));
  const ParamInfo& a = stage.table.at("layers.1.mlp.fc1.weight");
  const ParamInfo& b = one.table.at("layers.1.mlp.fc1.weight");
  BOOST_TEST(std::equal(stage.params.data + a.offset, stage.params.data + a.offset + a.numel(),
                        one.params.data + b.offset));

  auto stddev = [&](const char* name) {
    const ParamInfo& e = one.table.at(name);
    double ss = 0;
    for (int64_t i = 0; i < e.numel(); ++i)
      ss += double(one.params.data[e.offset + i]) * one.params.data[e.offset + i];
    return std::sqrt(ss / e.numel());
  };
  BOOST_TEST(std::abs(stddev("wte") - 0.02) < 0.001);
  BOOST_TEST(std::abs(stddev("layers.0.mlp.fc1.weight") - 0.02) < 0.001);
  BOOST_TEST(std::abs(stddev("layers.0.attn.proj.weight") - 0.02 / 2.0) < 0.001);  // 1/sqrt(2*2)
  BOOST_TEST(one.params.data[one.table.at("layers.0.attn.norm.weight").offset] == 1.0f);
  BOOST_TEST(one.params.data[one.table.at("layers.0.attn.qkv.bias").offset] == 0.0f);
}

BOOST_AUTO_TEST_CASE(model_gradients_match_finite_differences) {
  for (bool llama : {false, true}) {
    BOOST_TEST_CONTEXT(std::string(llama ? "llama" : "gpt2")) {
      auto be = make_cpu_backend();
      const ModelSpec spec = tiny_spec(llama);
      const int B = 2, T = spec.seq_len;
      Data d(B * T, spec.vocab, 5);
      SerialExecutor run(spec, *be, B, B, Recompute::none, d.samples(), grads_only());
      Model& m = run.model();
      // Bigger weights than the init so that every parameter's gradient is well above noise.
      for (const ParamInfo& p : m.table.entries()) {
        Tensor t = m.params.slice(p.offset, p.shape);
        if (p.shape.ndim() == 2)
          be->scale(t, 10.0f);
        else
          for (int64_t i = 0; i < t.numel(); ++i) t.data[i] += 0.1f * std::cos(float(i));
      }
      const float loss0 = run.ex->step(0).loss;
      const std::vector<float> g = to_vec(m.grads);
      BOOST_TEST(std::isfinite(loss0));
      auto loss = [&] { return double(run.ex->step(0).loss); };
      const double h = 1e-2;
      for (const ParamInfo& p : m.table.entries()) {
        BOOST_TEST_CONTEXT(p.name) {
          double max_err = 0, max_ref = 0;
          for (int64_t i = 0; i < p.numel(); ++i)
            max_ref = std::max(max_ref, double(std::abs(g[p.offset + i])));
          const int64_t stride = std::max<int64_t>(1, p.numel() / 12);
          for (int64_t i = 0; i < p.numel(); i += stride) {
            float& w = m.params.data[p.offset + i];
            const float saved = w;
            w = saved + float(h);
            const double lp = loss();
            w = saved - float(h);
            const double lm = loss();
            w = saved;
            max_err = std::max(max_err, std::abs((lp - lm) / (2 * h) - g[p.offset + i]));
          }
          BOOST_TEST(max_err <= 3e-2 * max_ref + 2e-4,
                     "max err " << max_err << " vs max |g| " << max_ref);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(microbatches_and_recompute_give_the_same_gradients) {
  for (bool llama : {false, true}) {
    BOOST_TEST_CONTEXT(std::string(llama ? "llama" : "gpt2")) {
      auto be = make_cpu_backend();
      const ModelSpec spec = tiny_spec(llama);
      const TransformerConfig c = transformer_config(spec);
      const std::vector<float> params = to_vec(make_model(*be, c, 11).params);
      const int B = 4;
      Data d(B * c.max_seq, c.vocab, 9);
      const auto [loss_ref, g_ref] = grads_of(*be, spec, params, d, B, 1, Recompute::none);
      for (int mb : {2, 4}) {
        for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
          const auto [loss, g] = grads_of(*be, spec, params, d, B, mb, mode);
          BOOST_TEST(std::abs(loss - loss_ref) <= 1e-6f * loss_ref);
          BOOST_TEST(rel_maxnorm(g, g_ref) < 1e-5);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(lr_schedule_and_clipping) {
  LrSchedule s{1.0f, 0.1f, 4, 14};
  BOOST_TEST(s.at(0) == 0.25f);
  BOOST_TEST(s.at(3) == 1.0f);
  BOOST_TEST(s.at(4) == 1.0f);
  BOOST_TEST(std::abs(s.at(9) - 0.55f) < 1e-6f);  // half way down the cosine
  BOOST_TEST(s.at(14) == 0.1f);
  BOOST_TEST(s.at(100) == 0.1f);
  BOOST_TEST((LrSchedule{2.0f, 0.0f, 0, 0}.at(7)) == 2.0f);

  auto be = make_cpu_backend();
  Tensor g = be->allocate(Shape{2});
  g.data[0] = 3, g.data[1] = 4;
  BOOST_TEST(clip_grad_norm(*be, g, 10.0f) == 5.0f);
  BOOST_TEST(g.data[0] == 3.0f);
  BOOST_TEST(clip_grad_norm(*be, g, 1.0f) == 5.0f);
  BOOST_TEST(std::abs(std::hypot(g.data[0], g.data[1]) - 1.0) < 1e-5);
  BOOST_TEST(clip_coefficient(5.0, 0.0f) == 1.0f);
}

BOOST_AUTO_TEST_CASE(adamw_decays_2d_weights_only) {
  auto be = make_cpu_backend();
  const TransformerConfig c = transformer_config(tiny_spec(false));
  Model m = make_model(*be, c, 1);
  be->fill(m.grads, 0.0f);
  const std::vector<float> before = to_vec(m.params);
  AdamW opt(*be, m.table.size(), AdamWConfig{0.9f, 0.95f, 1e-8f, 0.5f});
  const auto spans = m.table.spans(0, m.table.size());
  opt.step(*be, m.params, m.grads, spans, 0.1f);
  for (const ParamInfo& p : m.table.entries()) {
    const float b = before[p.offset], a = m.params.data[p.offset];
    if (p.decay())
      BOOST_TEST(std::abs(a - b * (1 - 0.05f)) <= 1e-7f, p.name);
    else
      BOOST_TEST(a == b, p.name);
  }
  BOOST_TEST(opt.steps_taken() == 1);
}

BOOST_AUTO_TEST_CASE(training_overfits_one_batch) {
  for (bool llama : {false, true}) {
    auto be = make_cpu_backend();
    const ModelSpec spec = tiny_spec(llama);
    const int B = 4, T = spec.seq_len;
    Data d(B * T, spec.vocab, 2);
    ExecutorOptions o;
    o.seed = 5;
    o.schedule = LrSchedule{1e-2f, 1e-3f, 5, 60};
    SerialExecutor run(spec, *be, B, B / 2, Recompute::selective, d.samples(), o);
    float first = 0, last = 0;
    for (int step = 0; step < 60; ++step) {
      const StepResult s = run.ex->step(step);
      if (step == 0) first = s.loss;
      last = s.loss;
      BOOST_TEST(std::isfinite(s.grad_norm));
    }
    BOOST_TEST(std::abs(first - std::log(float(spec.vocab))) < 0.1f);  // near-uniform at init
    BOOST_TEST(last < 0.5f * first, (llama ? "llama" : "gpt2")
                                        << " loss " << first << " -> " << last);
  }
}

BOOST_AUTO_TEST_CASE(plans_the_runtime_cannot_run_are_refused) {
  auto be = make_cpu_backend();
  const ModelSpec spec = tiny_spec(false);
  Data d(4 * spec.seq_len, spec.vocab, 2);
  ClusterSpec c = load_cluster("cpu-local");
  c.nodes = 1, c.node.gpus_per_node = 1;
  Plan p = test::serial_plan(spec, 4, 2, Recompute::none);
  ParallelState state(MPI_COMM_WORLD, p, c, 0);
  FixedSamples samples = d.samples();
  Plan bf16 = p;
  bf16.dtype = Dtype::bf16;
  BOOST_CHECK_THROW(Executor(state, spec, bf16, *be, samples, {}), NotSupported);
  // A plan for another world size than the job's.
  Plan two = test::serial_plan(spec, 4, 2, Recompute::none);
  ClusterSpec c2 = c;
  c2.node.gpus_per_node = 2;
  two.embedding.dp = 2;
  for (auto& l : two.layers) l.dp = 2;
  BOOST_CHECK_THROW(ParallelState(MPI_COMM_WORLD, two, c2, 0), InputError);
}
