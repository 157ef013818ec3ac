// The production executor against an independent PyTorch implementation (reference.py): the
// C++ side writes weights and a batch to HDF5, runs the script, and compares the loss, every
// parameter gradient and ten AdamW steps (with clipping and the cosine schedule). On one rank
// the plan is serial; under `mpirun -np 4` it is tp 2 x pp 2, and every rank compares its own
// shard of each gradient with the reference's whole tensor.
#define BOOST_TEST_MODULE reference
#include <hdf5.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "stratagem/loaders.hpp"
#include "stratagem/transformer.hpp"
#include "test/reference/h5_min.hpp"
#include "test/support/fp32_bounds.hpp"
#include "test/support/serial_executor.hpp"

using namespace stratagem;
using MpiSession = stratagem::test::MpiSession;
BOOST_GLOBAL_FIXTURE(MpiSession);
namespace fs = std::filesystem;

#ifndef STRATAGEM_PYTHON
#define STRATAGEM_PYTHON "/usr/bin/python3"
#endif

using namespace stratagem::test;
namespace {

struct Case {
  std::string name;
  ModelSpec spec;
  int batch = 4, micro_batches = 2;
  Recompute train_mode = Recompute::none;
};

ModelSpec gpt2_tiny() {
  ModelSpec s;
  s.name = "gpt2-tiny";
  s.layers = 2;
  s.hidden = 64;
  s.heads = 4;
  s.kv_heads = 4;
  s.ffn_hidden = 256;
  s.vocab = 96;
  s.seq_len = 32;
  return s;
}

ModelSpec llama_tiny() {
  ModelSpec s;
  s.name = "llama-tiny";
  s.layers = 2;
  s.hidden = 64;
  s.heads = 4;
  s.kv_heads = 2;
  s.ffn_hidden = 128;
  s.vocab = 96;
  s.seq_len = 32;
  s.norm = Norm::rmsnorm;
  s.activation = Activation::swiglu;
  s.position = Position::rope;
  s.tied_embeddings = false;
  s.bias = false;
  return s;
}

// LLaMA with one dense layer and one MoE layer (4 experts, top-2, one shared expert).
ModelSpec llama_moe_tiny() {
  ModelSpec s = llama_tiny();
  s.name = "llama-moe-tiny";
  s.moe.experts = 4;
  s.moe.top_k = 2;
  s.moe.expert_ffn_hidden = 48;
  s.moe.shared_experts = 1;
  s.moe.dense_layers = 1;
  s.moe.router_score = RouterScore::softmax;
  s.moe.aux_loss_coeff = 0.01;
  return s;
}

constexpr int kSteps = 10;
const AdamWConfig kAdamW{0.9f, 0.95f, 1e-8f, 0.1f};
ExecutorOptions options() {
  ExecutorOptions t;
  t.grad_clip = 0.5f;  // below the initial norm, so clipping is exercised
  t.schedule = LrSchedule{3e-3f, 3e-4f, 3, 10};
  t.adamw = kAdamW;
  return t;
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// The plan of this run: serial on one rank, tp 2 x pp 2 (1F1B) on four (an MoE model:
// ep 2 x dp 2 x pp 2).
struct Layouted {
  ClusterSpec cluster;
  Plan plan;
};
Layouted layout_for(const ModelSpec& m, int batch, int micro, Recompute rc) {
  Layouted l{load_cluster("cpu-local"), test::serial_plan(m, batch, micro, rc)};
  l.cluster.nodes = 1;
  l.cluster.node.gpus_per_node = world_size();
  if (world_size() == 4) {
    PlanShorthand s;
    s.tp = 2, s.pp = 2, s.dp = 1, s.micro_batch = micro, s.global_batch = batch;
    // MoE layers run with tp 1: expert parallelism over the data-parallel ranks instead.
    if (m.moe.enabled()) s.tp = 1, s.dp = 2, s.ep = 2;
    s.recompute = rc == Recompute::none        ? "none"
                  : rc == Recompute::selective ? "selective"
                                               : "full";
    s.dtype = "fp32";
    l.plan = expand_shorthand(s, m, l.cluster);
  } else if (world_size() != 1) {
    throw std::runtime_error("the reference test runs on 1 or 4 ranks");
  }
  return l;
}

// An executor of this run's plan whose parameters are the whole model's `whole` (flat, in the
// whole model's table order).
struct Run {
  Layouted l;
  test::FixedSamples samples;
  std::unique_ptr<ParallelState> state;
  std::unique_ptr<Executor> ex;
  Run(const ModelSpec& m, Backend& be, const ParamTable& whole_table,
      const std::vector<float>& whole, int batch, int micro, Recompute rc, ExecutorOptions o,
      const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets)
      : l(layout_for(m, batch, micro, rc)), samples(tokens, targets) {
    state = std::make_unique<ParallelState>(MPI_COMM_WORLD, l.plan, l.cluster, 0);
    ex = std::make_unique<Executor>(*state, m, l.plan, be, samples, o);
    Model& mine = ex->model();
    for (const ParamInfo& p : mine.table.entries()) {
      const ParamInfo& w = whole_table.at(p.name);
      for (int64_t i = 0; i < p.numel(); ++i) {
        const int64_t j = p.logical_index(i);
        mine.params.data[p.offset + i] = j < 0 ? 0.0f : whole[w.offset + j];
      }
    }
  }
};

struct Reference {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
  std::vector<double> step_losses, grad_norms;
};

// Writes the model's weights and the batch, runs reference.py, reads what it computed.
Reference run_reference(const Case& c, const TransformerConfig& cfg, const Model& m,
                        const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets) {
  const fs::path dir =
      fs::temp_directory_path() / ("stratagem-ref-" + std::to_string(::getpid()) + "-" + c.name);
  fs::create_directories(dir);
  const fs::path in = dir / "in.h5", out = dir / "out.h5";
  {
    const hid_t f = H5Fcreate(in.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0) throw std::runtime_error("cannot create " + in.string());
    nlohmann::json config = {{"layers", cfg.layers},
                             {"hidden", cfg.hidden},
                             {"heads", cfg.heads},
                             {"kv_heads", cfg.kv_heads},
                             {"ffn_hidden", cfg.ffn_hidden},
                             {"vocab", cfg.vocab},
                             {"seq_len", cfg.max_seq},
                             {"norm", to_string(cfg.norm)},
                             {"activation", to_string(cfg.activation)},
                             {"position", to_string(cfg.position)},
                             {"tied_embeddings", cfg.tied_embeddings},
                             {"bias", cfg.bias},
                             {"norm_eps", cfg.norm_eps},
                             {"rope_theta", cfg.rope_theta}};
    if (cfg.moe.enabled()) {
      // The load-balancing loss is per micro-batch: the reference splits the batch the same way.
      config["micro_batches"] = c.micro_batches;
      config["moe"] = {{"experts", cfg.moe.experts},
                       {"top_k", cfg.moe.top_k},
                       {"expert_ffn_hidden", cfg.moe.expert_ffn_hidden},
                       {"shared_experts", cfg.moe.shared_experts},
                       {"dense_layers", cfg.moe.dense_layers},
                       {"router_score", to_string(cfg.moe.router_score)},
                       {"aux_loss_coeff", cfg.moe.aux_loss_coeff}};
    }
    const LrSchedule s = options().schedule;
    const nlohmann::json hyper = {{"max_lr", s.max_lr},
                                  {"min_lr", s.min_lr},
                                  {"warmup_steps", s.warmup_steps},
                                  {"total_steps", s.total_steps},
                                  {"steps", kSteps},
                                  {"weight_decay", kAdamW.weight_decay},
                                  {"beta1", kAdamW.beta1},
                                  {"beta2", kAdamW.beta2},
                                  {"eps", kAdamW.eps},
                                  {"grad_clip", options().grad_clip}};
    write_string_attr(f, "config", config.dump());
    write_string_attr(f, "hyper", hyper.dump());
    const hid_t g = H5Gcreate2(f, "params", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    for (const ParamInfo& p : m.table.entries()) {
      std::vector<hsize_t> dims;
      for (int i = 0; i < p.shape.ndim(); ++i) dims.push_back(static_cast<hsize_t>(p.shape[i]));
      write_dataset(g, p.name, H5T_NATIVE_FLOAT, m.params.data + p.offset, dims);
    }
    H5Gclose(g);
    const std::vector<hsize_t> bt{static_cast<hsize_t>(c.batch), static_cast<hsize_t>(cfg.max_seq)};
    write_dataset(f, "tokens", H5T_NATIVE_INT32, tokens.data(), bt);
    write_dataset(f, "targets", H5T_NATIVE_INT32, targets.data(), bt);
    H5Fclose(f);
  }
  const std::string cmd = std::string(STRATAGEM_PYTHON) + " \"" + STRATAGEM_SOURCE_DIR +
                          "/test/reference/reference.py\" \"" + in.string() + "\" \"" +
                          out.string() + "\"";
  BOOST_TEST_MESSAGE("running " << cmd);
  const int rc = std::system(cmd.c_str());
  BOOST_REQUIRE_MESSAGE(rc == 0, "reference.py failed (status " << rc << "): " << cmd);

  Reference r;
  const hid_t f = H5Fopen(out.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  BOOST_REQUIRE_MESSAGE(f >= 0, "cannot open " << out);
  r.loss = read_doubles(f, "loss").at(0);
  for (const ParamInfo& p : m.table.entries()) r.grads[p.name] = read_doubles(f, "grads/" + p.name);
  r.step_losses = read_doubles(f, "step_losses");
  r.grad_norms = read_doubles(f, "grad_norms");
  H5Fclose(f);
  fs::remove_all(dir);
  return r;
}

// Every gradient's error (max-norm relative to the whole reference tensor), each rank on
// its own shard; returns the worst tensor's error over all ranks.
double worst_grad_error(const Model& m, const Reference& r, std::string* worst_name) {
  double worst = 0;
  for (const ParamInfo& p : m.table.entries()) {
    const std::vector<double>& ref = r.grads.at(p.name);
    double err = 0, mag = 0;
    for (double x : ref) mag = std::max(mag, std::abs(x));
    for (int64_t i = 0; i < p.numel(); ++i) {
      const int64_t j = p.logical_index(i);
      if (j >= 0) err = std::max(err, std::abs(m.grads.data[p.offset + i] - ref[size_t(j)]));
    }
    const double e = mag > 0 ? err / mag : err;
    if (e >= worst) {
      worst = e;
      if (worst_name) *worst_name = p.name;
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return worst;
}

void check_against_reference(const Case& c) {
  auto be = make_cpu_backend();
  const TransformerConfig cfg = transformer_config(c.spec);
  Model m = make_model(*be, cfg, 1234);
  // GPT-2 init keeps every pre-activation near 0, where e.g. exact and tanh GELU agree to
  // 1e-5; larger weights and non-trivial norms/biases make each detail of the math visible.
  for (const ParamInfo& p : m.table.entries()) {
    Tensor t = m.params.slice(p.offset, p.shape);
    if (p.shape.ndim() == 2)
      be->scale(t, 8.0f);
    else
      for (int64_t i = 0; i < t.numel(); ++i)
        t.data[i] += 0.1f * std::sin(0.7f * float(i + p.offset));
  }
  const std::vector<float> whole(m.params.data, m.params.data + m.params.numel());
  const int T = cfg.max_seq;
  std::vector<int32_t> tokens(static_cast<size_t>(c.batch) * T), targets(tokens.size());
  const int64_t step_tokens = int64_t(c.batch) * T;  // the loss mean's length
  std::mt19937 rng(77);
  std::uniform_int_distribution<int32_t> id(0, cfg.vocab - 1);
  for (auto& t : tokens) t = id(rng);
  // Targets are the next token, as in language modelling; the last one is random.
  for (size_t i = 0; i < tokens.size(); ++i)
    targets[i] = (i + 1) % T == 0 ? id(rng) : tokens[i + 1];

  // Every rank reads the reference's output; rank 0 runs it.
  Reference ref;
  if (world_rank() == 0) ref = run_reference(c, cfg, m, tokens, targets);
  {
    std::vector<double> flat = {ref.loss};
    std::vector<int> sizes;
    for (const ParamInfo& p : m.table.entries()) {
      if (world_rank() != 0) ref.grads[p.name].assign(size_t(p.numel()), 0.0);
      MPI_Bcast(ref.grads[p.name].data(), int(p.numel()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
    MPI_Bcast(&ref.loss, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    ref.step_losses.resize(kSteps);
    ref.grad_norms.resize(kSteps);
    MPI_Bcast(ref.step_losses.data(), kSteps, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    MPI_Bcast(ref.grad_norms.data(), kSteps, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  }
  ExecutorOptions grads_only = options();
  grads_only.update = false;

  // Loss and gradients, under every recompute mode and micro-batch split.
  for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
    const std::vector<int> splits = c.spec.moe.enabled() ? std::vector<int>{c.micro_batches}
                                                         : std::vector<int>{1, c.micro_batches};
    for (int mb : splits) {
      BOOST_TEST_CONTEXT(c.name << " recompute=" << static_cast<int>(mode)
                                << " micro_batches=" << mb) {
        Run run(c.spec, *be, m.table, whole, c.batch, c.batch / mb, mode, grads_only, tokens,
                targets);
        const float loss = run.ex->step(0).loss;
        // The reference is float64: the bounds are one fp32 pass's rounding against exact
        // sums (fp32_bounds.hpp, derived from the model's reduction lengths).
        BOOST_TEST(std::abs(loss - ref.loss) <= pass_rtol(c.spec, step_tokens) * std::abs(ref.loss),
                   "loss " << loss << " vs reference " << ref.loss << ", bound "
                           << pass_rtol(c.spec, step_tokens));
        std::string worst_name;
        const double worst = worst_grad_error(run.ex->model(), ref, &worst_name);
        BOOST_TEST(worst <= grad_rtol(c.spec, step_tokens),
                   "worst gradient " << worst_name << ": " << worst << ", bound "
                                     << grad_rtol(c.spec, step_tokens));
        BOOST_TEST_MESSAGE(c.name << ": loss " << loss << " (ref " << ref.loss
                                  << "), worst grad error " << worst << " in " << worst_name);
      }
    }
  }

  // The comparison can fail: a 1% change of one gradient entry is caught.
  {
    Run run(c.spec, *be, m.table, whole, c.batch, c.batch, Recompute::none, grads_only, tokens,
            targets);
    run.ex->step(0);
    Model& mine = run.ex->model();
    const ParamInfo* p = mine.table.find("layers.1.mlp.fc2.weight");
    if (!p) p = mine.table.find("layers.1.mlp.experts.0.fc2.weight");
    if (p) {
      const auto& g = ref.grads.at(p->name);
      double mag = 0;
      for (double x : g) mag = std::max(mag, std::abs(x));
      mine.grads.data[p->offset + 5] += static_cast<float>(0.01 * mag);
    }
    BOOST_TEST(worst_grad_error(mine, ref, nullptr) > grad_rtol(c.spec, step_tokens));
  }

  // Ten AdamW steps with clipping and the warm-up + cosine schedule.
  Run run(c.spec, *be, m.table, whole, c.batch, c.batch / c.micro_batches, c.train_mode, options(),
          tokens, targets);
  double worst_step = 0;
  for (int step = 0; step < kSteps; ++step) {
    const StepResult s = run.ex->step(step);
    worst_step = std::max(
        worst_step, std::abs(s.loss - ref.step_losses[step]) / std::abs(ref.step_losses[step]));
    // Step t's loss carries its own pass and the t updates before it (loss_rtol); the norm of
    // the gradient is as close as its entries (grad_rtol), plus its own sum of squares.
    const double loss_bound = loss_rtol(c.spec, step_tokens, step + 1);
    const double norm_bound =
        grad_rtol(c.spec, step_tokens) * (step + 1) + reductions_rtol({m.params.numel()});
    BOOST_TEST(
        std::abs(s.loss - ref.step_losses[step]) <= loss_bound * std::abs(ref.step_losses[step]),
        c.name << " step " << step << ": loss " << s.loss << " vs reference "
               << ref.step_losses[step] << ", bound " << loss_bound);
    BOOST_TEST(std::abs(s.grad_norm - ref.grad_norms[step]) <= norm_bound * ref.grad_norms[step],
               c.name << " step " << step << ": grad norm " << s.grad_norm << " vs reference "
                      << ref.grad_norms[step] << ", bound " << norm_bound);
  }
  BOOST_TEST_MESSAGE(c.name << ": " << kSteps << " AdamW steps, loss " << ref.step_losses.front()
                            << " -> " << ref.step_losses.back()
                            << ", worst relative step-loss error " << worst_step);
  BOOST_TEST(ref.grad_norms[0] > options().grad_clip);  // clipping was active
  BOOST_TEST(ref.step_losses.back() < ref.step_losses.front());
}

}  // namespace

BOOST_AUTO_TEST_CASE(gpt2_tiny_matches_pytorch) {
  check_against_reference(Case{"gpt2", gpt2_tiny(), 4, 2, Recompute::none});
}

BOOST_AUTO_TEST_CASE(llama_tiny_matches_pytorch) {
  check_against_reference(Case{"llama", llama_tiny(), 4, 4, Recompute::selective});
}

BOOST_AUTO_TEST_CASE(llama_moe_tiny_matches_pytorch) {
  check_against_reference(Case{"llama-moe", llama_moe_tiny(), 4, 2, Recompute::full});
}
