// Memory per rank: Megatron's activation formulas, GPT-3's parameters per rank, ZeRO/offload
// model states, and stage_memory's closed form against an independent walk over the Program's
// alloc/free ops.
#define BOOST_TEST_MODULE cost_memory
#include <algorithm>
#include <boost/test/unit_test.hpp>

#include "stratagem/cost.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/program.hpp"

using namespace stratagem;

namespace {

ModelSpec tiny_gpt(int layers = 8) {
  ModelSpec m;
  m.name = "tiny";
  m.layers = layers, m.hidden = 256, m.heads = 8, m.kv_heads = 8, m.ffn_hidden = 1024;
  m.vocab = 1000, m.seq_len = 128;
  return m;
}

ModelSpec tiny_llama() {
  ModelSpec m = tiny_gpt(6);
  m.name = "tiny-llama";
  m.kv_heads = 2, m.ffn_hidden = 704, m.norm = Norm::rmsnorm, m.activation = Activation::swiglu;
  m.position = Position::rope, m.tied_embeddings = false, m.bias = false, m.dropout = false;
  return m;
}

// The Program's peak per stage, found by walking its alloc/free ops in stream order (all ranks
// of a stage run the same stream).
struct Walked {
  int64_t by_cat[kNumMemCategories] = {};
  int64_t total = 0;
};
Walked walk_peak(const StageProgram& st) {
  int64_t live[kNumMemCategories] = {}, total = 0;
  Walked best;
  for (const Op& op : st.ops) {
    if (op.kind != OpKind::alloc && op.kind != OpKind::free) continue;
    const int c = static_cast<int>(op.category);
    const int64_t d = op.kind == OpKind::alloc ? op.bytes : -op.bytes;
    live[c] += d, total += d;
    if (total > best.total) {
      best.total = total;
      std::copy(live, live + kNumMemCategories, best.by_cat);
    }
  }
  BOOST_TEST(total == 0);  // every buffer freed
  return best;
}

struct Case {
  std::string name;
  ModelSpec model;
  ClusterSpec cluster;
  Plan plan;
};

Case make(std::string name, ModelSpec m, int nodes, PlanShorthand s) {
  Case c{std::move(name), std::move(m), load_cluster("dgx-a100-80g"), {}};
  c.cluster.nodes = nodes;
  c.plan = expand_shorthand(s, c.model, c.cluster);
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  PlanShorthand s;
  s.tp = 2, s.pp = 2, s.micro_batch = 1, s.global_batch = 32;
  out.push_back(make("1f1b tp2 pp2 dp4", tiny_gpt(), 2, s));
  s = {};
  s.pp = 4, s.micro_batch = 2, s.global_batch = 32, s.schedule = "gpipe", s.zero = 1;
  out.push_back(make("gpipe pp4 dp4 z1", tiny_gpt(), 2, s));
  s = {};
  s.tp = 4, s.pp = 2, s.vpp = 2, s.micro_batch = 1, s.global_batch = 16;
  s.sequence_parallel = true, s.recompute = "selective";
  out.push_back(make("interleaved pp2 v2 tp4 sp selective", tiny_gpt(), 1, s));
  s = {};
  s.tp = 1, s.pp = 4, s.vpp = 2, s.micro_batch = 1, s.global_batch = 32, s.zero = 2;
  out.push_back(make("interleaved pp4 v2 z2 dp4", tiny_gpt(), 2, s));
  s = {};
  s.tp = 2, s.pp = 2, s.micro_batch = 2, s.global_batch = 64, s.recompute = "full";
  s.no_overlap_grad_reduce = true;
  out.push_back(make("1f1b full recompute", tiny_gpt(), 2, s));
  s = {};
  s.tp = 2, s.pp = 4, s.micro_batch = 1, s.global_batch = 2;
  out.push_back(make("1f1b fewer micro-batches than stages", tiny_gpt(), 1, s));
  s = {};
  s.tp = 2, s.pp = 1, s.micro_batch = 2, s.global_batch = 16, s.zero = 3, s.flash_attention = true;
  s.offload = "optimizer,activations";
  out.push_back(make("zero3 flash offload optimizer+activations", tiny_gpt(), 1, s));
  s = {};
  s.tp = 1, s.pp = 2, s.micro_batch = 1, s.global_batch = 16, s.offload = "params";
  s.recompute = "selective";
  out.push_back(make("offload params", tiny_gpt(), 1, s));
  s = {};
  s.tp = 2, s.pp = 3, s.micro_batch = 1, s.global_batch = 24, s.zero = 1;
  out.push_back(make("llama gqa pp3 untied", tiny_llama(), 3, s));
  // Interleaved with chunks of different sizes: the closed form steps through the schedule.
  s = {};
  s.tp = 2, s.pp = 2, s.vpp = 2, s.micro_batch = 1, s.global_batch = 16;
  Case u = make("interleaved uneven chunks", tiny_gpt(), 1, s);
  u.plan.chunks = {{0, 1}, {1, 4}, {4, 6}, {6, 8}};
  out.push_back(u);
  // Heterogeneous: layers differ in every per-layer field.
  s = {};
  s.tp = 2, s.pp = 2, s.micro_batch = 1, s.global_batch = 32;
  Case h = make("heterogeneous", tiny_gpt(), 2, s);
  auto& L = h.plan.layers;
  L[0] = {1, 8, false, 0, Recompute::none, false, false, false};
  L[1] = {4, 2, true, 3, Recompute::full, false, false, false};
  L[2] = {2, 4, false, 2, Recompute::selective, true, false, true};
  L[3] = {8, 1, true, 0, Recompute::none, false, false, false};
  L[4] = {2, 4, false, 1, Recompute::full, false, true, false};
  L[5] = {4, 2, false, 3, Recompute::none, true, true, true};
  h.plan.chunks = {{0, 3}, {3, 8}};
  out.push_back(h);
  // Mixture-of-Experts under ZeRO-3: the experts sharded over an expert data-parallel group
  // of 2 (gathered before their compute, gradients staged for their reduce-scatter), and of 1
  // (held whole); with full recompute the backward's gather serves the recompute too.
  ModelSpec moe = tiny_llama();
  moe.moe.experts = 4, moe.moe.top_k = 2, moe.moe.expert_ffn_hidden = 512;
  moe.moe.dense_layers = 1;
  s = {};
  s.pp = 2, s.ep = 2, s.micro_batch = 1, s.global_batch = 16, s.zero = 3;
  out.push_back(make("moe ep2 expert_dp2 z3", moe, 1, s));
  s.recompute = "full";
  out.push_back(make("moe ep2 expert_dp2 z3 full recompute", moe, 1, s));
  s = {};
  s.pp = 2, s.ep = 4, s.micro_batch = 1, s.global_batch = 16, s.zero = 3;
  out.push_back(make("moe ep4 expert_dp1 z3", moe, 1, s));
  s.zero = 2, s.pp = 1, s.ep = 2;
  out.push_back(make("moe ep2 expert_dp4 z2", moe, 1, s));
  s.zero = 3, s.offload = "params";  // each pass copies the experts' shard up, then gathers
  out.push_back(make("moe ep2 expert_dp4 z3 offload params", moe, 1, s));
  s.zero = 1;  // ... copies them up whole
  out.push_back(make("moe ep2 expert_dp4 z1 offload params", moe, 1, s));
  for (auto& c : out) validate(c.plan, c.model, c.cluster, c.name);
  return out;
}

// Megatron's per-layer activation bytes (Korthikanti et al. 2022, Table 2) for a GPT layer.
double sbh(const ModelSpec& m, int b) {
  return double(m.seq_len) * b * m.hidden;
}
int64_t layer_bytes(const ModelSpec& m, LayerStrategy st, int b, Recompute rc) {
  return saved_activation_bytes(m, st, Block::attention, b, rc, false, Dtype::bf16) +
         saved_activation_bytes(m, st, Block::mlp, b, rc, false, Dtype::bf16);
}

}  // namespace

BOOST_AUTO_TEST_CASE(megatron_activation_formulas) {
  const ModelSpec m = load_model("gpt3-175b");
  const double s = m.seq_len, h = m.hidden, a = m.heads;
  for (int b : {1, 2}) {
    for (int t : {1, 2, 8}) {
      LayerStrategy st;
      st.tp = t;
      BOOST_TEST_INFO("b " << b << " t " << t);
      if (t == 1) {
        BOOST_TEST(layer_bytes(m, st, b, Recompute::none) == sbh(m, b) * (34 + 5 * a * s / h));
      } else {
        BOOST_TEST(layer_bytes(m, st, b, Recompute::none) ==
                   sbh(m, b) * (10 + 24.0 / t + 5 * a * s / (h * t)));
      }
      st.sequence_parallel = true;
      BOOST_TEST(layer_bytes(m, st, b, Recompute::none) == sbh(m, b) / t * (34 + 5 * a * s / h));
      BOOST_TEST(layer_bytes(m, st, b, Recompute::selective) == 34 * sbh(m, b) / t);
      BOOST_TEST(layer_bytes(m, st, b, Recompute::full) == 2 * sbh(m, b) / t);
      st.sequence_parallel = false;
      BOOST_TEST(layer_bytes(m, st, b, Recompute::full) == 2 * sbh(m, b));
    }
  }
}

BOOST_AUTO_TEST_CASE(gpt3_parameters_per_rank_tp8_pp16) {
  const ModelSpec m = load_model("gpt3-175b");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 128;
  PlanShorthand s;
  s.tp = 8, s.pp = 16, s.dp = 8, s.micro_batch = 1, s.global_batch = 1536;
  const Plan p = expand_shorthand(s, m, c);
  CostModel cm(m, c, p.dtype);
  const auto mem = stage_memory(cm, p);
  BOOST_REQUIRE(mem.size() == 16u);
  // bf16 weights: 2 bytes per parameter held by the rank.
  auto params = [&](int stage) { return double(mem[stage].weights_bytes) / 2; };
  const double per_rank = 174.6e9 / 128;
  // A middle stage holds 6 of the 96 layers, a 1/8 tensor shard of each (norms and a few biases
  // are replicated): 174.6e9/128 up to the embedding's share.
  BOOST_TEST(std::abs(params(7) - per_rank) / per_rank < 0.01);
  const double embedding = double(m.vocab) * m.hidden / 8;
  BOOST_TEST(std::abs(params(0) - embedding - double(m.seq_len) * m.hidden - per_rank) / per_rank <
             0.01);
  BOOST_TEST(std::abs(params(15) - embedding - per_rank) / per_rank < 0.01);  // tied LM head copy
  // Summed over the 128 model-parallel ranks: the model, plus the last stage's head copy.
  double total = 0;
  for (int st = 0; st < 16; ++st) total += params(st) * 8;
  BOOST_TEST(std::abs(total - double(m.vocab) * m.hidden - 174.6e9) / 174.6e9 < 0.01);
  // Model states 2 + 2 + 12 bytes per parameter without ZeRO.
  BOOST_TEST(mem[7].grads_bytes == mem[7].weights_bytes);
  BOOST_TEST(mem[7].optimizer_bytes == 6 * mem[7].weights_bytes);
}

BOOST_AUTO_TEST_CASE(zero_and_offload_model_states) {
  const ModelSpec m = load_model("gpt3-1.3b");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 4;  // 32 GPUs: tp 2 x pp 2 x dp 8
  const int dp = 8;
  // Parameters of stage 0 on one rank (tp 2): 12 layers + the word/position embedding.
  const int64_t layer = block_parameters_per_rank(m, 2, Block::attention) +
                        block_parameters_per_rank(m, 2, Block::mlp);
  const int64_t emb = embedding_parameters_per_rank(m, 2);
  const int n = m.layers / 2;
  auto shard = [&](int64_t x) { return (x + dp - 1) / dp; };  // ZeRO shards each layer
  const int64_t P = n * layer + emb, Ps = n * shard(layer) + shard(emb);
  struct Expect {
    int zero;
    const char* offload;
    int64_t w, g, o;
  };
  const Expect expects[] = {
      {0, "none", 2 * P, 2 * P, 12 * P},   {1, "none", 2 * P, 2 * P, 12 * Ps},
      {2, "none", 2 * P, 2 * Ps, 12 * Ps}, {3, "none", 2 * Ps, 2 * Ps, 12 * Ps},
      {1, "optimizer", 2 * P, 2 * P, 0},   {0, "params", 0, 2 * P, 12 * P},
  };
  for (const Expect& x : expects) {
    PlanShorthand s;
    s.tp = 2, s.pp = 2, s.micro_batch = 1, s.global_batch = 16, s.zero = x.zero,
    s.offload = x.offload;
    const Plan p = expand_shorthand(s, m, c);
    validate(p, m, c, "zero");
    CostModel cm(m, c, p.dtype);
    const auto mem = stage_memory(cm, p);
    BOOST_TEST_INFO("zero " << x.zero << " offload " << x.offload);
    BOOST_TEST(mem[0].weights_bytes == x.w);
    BOOST_TEST(mem[0].grads_bytes == x.g);
    BOOST_TEST(mem[0].optimizer_bytes == x.o);
  }
}

BOOST_AUTO_TEST_CASE(stage_memory_matches_a_walk_over_the_program) {
  // Tolerance: none on what the Program allocates. stage_memory adds the gradient workspace of
  // the running layer (2 b s h elements) and the stage's GPU process ledger (CUDA context, NCCL,
  // cuBLAS workspace, fragmentation), which the Program does not allocate, so total - walked =
  // exactly those. Under a framework that stages ZeRO-2/3 gradients (stratagem's runtime) they
  // are Program buffers.
  FrameworkSpec staging;
  staging.layer_gradient_staging = true;
  // ... and one that keeps fp32 gradient buffers and holds more than the logits in its loss
  // (Megatron-Core's main_grad, nanotron's loss).
  FrameworkSpec fp32_buffers;
  fp32_buffers.grad_buffer_bytes = 4;
  fp32_buffers.loss_transient_bytes_per_logit = 6;
  for (const FrameworkSpec& fw : {FrameworkSpec{}, staging, fp32_buffers})
    for (const Case& c : cases()) {
      CostModel cm(c.model, c.cluster, c.plan.dtype, fw);
      const auto mem = stage_memory(cm, c.plan);
      const Program prog = build_program(c.model, c.plan, fw);
      BOOST_REQUIRE(mem.size() == prog.stages.size());
      for (size_t s = 0; s < mem.size(); ++s) {
        const Walked w = walk_peak(prog.stages[s]);
        const MemoryBreakdown& m = mem[s];
        const int64_t ws = workspace_bytes(cm, c.plan, int(s));
        BOOST_TEST_INFO(c.name << " stage " << s << " staging " << fw.layer_gradient_staging);
        BOOST_TEST(m.weights_bytes == w.by_cat[int(MemCategory::weights)]);
        BOOST_TEST(m.grads_bytes == w.by_cat[int(MemCategory::grads)]);
        BOOST_TEST(m.optimizer_bytes == w.by_cat[int(MemCategory::optimizer)]);
        BOOST_TEST(m.activations_bytes + m.buffers_bytes - ws ==
                   w.by_cat[int(MemCategory::activations)] + w.by_cat[int(MemCategory::buffers)]);
        BOOST_TEST(m.activations_bytes == w.by_cat[int(MemCategory::activations)]);
        const ProcessMemory pm = process_memory(c.model, c.cluster, c.plan, int(s));
        BOOST_TEST(m.total_bytes() - w.total == ws + pm.cuda_context_bytes + pm.nccl_buffers_bytes +
                                                    pm.cublas_workspace_bytes +
                                                    m.fragmentation_bytes);
        BOOST_TEST(m.cuda_context_bytes == c.cluster.gpu.process.cuda_context_bytes);
        BOOST_TEST(m.cublas_workspace_bytes == c.cluster.gpu.process.cublas_workspace_bytes);
        BOOST_TEST(m.nccl_buffers_bytes == pm.nccl_buffers_bytes);
        BOOST_TEST(std::abs(m.fragmentation_bytes - 0.05 * double(m.allocated_bytes())) <= 1.0);
      }
    }
}

BOOST_AUTO_TEST_CASE(schedule_in_flight_counts) {
  // Full recompute keeps 2sbh per layer; the schedule decides how many micro-batches' worth.
  const ModelSpec m = load_model("gpt3-175b");
  ClusterSpec c = load_cluster("dgx-a100-80g");
  c.nodes = 128;
  const double A = 6 * 2.0 * m.seq_len * m.hidden;  // one micro-batch on a stage (6 layers)
  auto acts = [&](PlanShorthand s) {
    s.tp = 8, s.pp = 16, s.dp = 8, s.micro_batch = 1, s.global_batch = 1536, s.recompute = "full";
    const Plan p = expand_shorthand(s, m, c);
    CostModel cm(m, c, p.dtype);
    std::vector<int64_t> out;
    for (const auto& x : stage_memory(cm, p)) out.push_back(x.activations_bytes);
    return out;
  };
  // 1F1B: min(pp - s, m) in flight on stage s: one fewer per stage down the pipeline.
  const auto f1b = acts({});
  for (int s = 1; s + 1 < 16; ++s) BOOST_TEST(double(f1b[s - 1] - f1b[s]) == A);
  // GPipe: all m = 192 micro-batches.
  PlanShorthand g;
  g.schedule = "gpipe";
  const auto gp = acts(g);
  BOOST_TEST(double(gp[3] - f1b[3]) == (192 - 13) * A);
  // Interleaved (v = 2, 3-layer chunks): Megatron's warm-up keeps 2(pp - s - 1) + (v-1) pp + 1
  // chunk passes in flight; stage 0 holds pp (1 + (pp-1)/(pp v)) micro-batches' worth.
  PlanShorthand iv;
  iv.vpp = 2;
  const auto il = acts(iv);
  const double chunk = A / 2;
  BOOST_TEST(double(il[0] - il[1]) == 2 * chunk);
  BOOST_TEST(double(il[0] - f1b[0]) == (2 * 15 + 16 + 1 - 16 * 2) * chunk);
}
