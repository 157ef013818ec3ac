// The schedule generator's exact op stream, pinned: every field of every op and every
// dependency of a set of plans hashes to a recorded value. A change to build_program that is
// meant only to make it faster must leave these hashes as they are; a change to the schedule
// itself re-records them in a commit of its own.
#define BOOST_TEST_MODULE program_hash
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <cstring>
#include <utility>

#include "stratagem/loaders.hpp"
#include "stratagem/program.hpp"

using namespace stratagem;

namespace {

// FNV-1a over each field by value (not the struct's bytes: padding is not part of the stream).
struct Hasher {
  uint64_t h = 1469598103934665603ull;
  void add(uint64_t v) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
  }
};

// The group selector ops carried before they carried their strategy: (tp, tp_big) as
// (tp, -) for tp, dp and cp groups and cp transfers, (from, to) for reshards, (etp, ep) for
// expert groups, 1 elsewhere.
std::pair<uint64_t, uint64_t> group_degrees(const Op& op) {
  const bool cp_transfer =
      (op.kind == OpKind::send || op.kind == OpKind::recv) && op.group == GroupKind::cp;
  if (op.kind != OpKind::collective && !cp_transfer) return {1, 1};
  switch (op.group) {
    case GroupKind::tp:
    case GroupKind::dp:
    case GroupKind::cp:
      return {uint64_t(op.strategy.tp), 1};
    case GroupKind::reshard:
      return {uint64_t(op.reshard_from_tp), uint64_t(op.reshard_to_tp)};
    case GroupKind::ep:
    case GroupKind::expert_dp:
    case GroupKind::expert_tp:
      return {uint64_t(op.strategy.etp), uint64_t(op.strategy.ep)};
    default:
      return {1, 1};
  }
}

uint64_t hash_program(const Program& prog) {
  Hasher x;
  x.add(uint64_t(prog.num_microbatches));
  x.add(prog.stages.size());
  for (const StageProgram& sp : prog.stages) {
    x.add(uint64_t(sp.stage));
    x.add(sp.ops.size());
    x.add(sp.deps.size());
    for (const Op& op : sp.ops) {
      x.add(uint64_t(op.kind) | uint64_t(op.stream) << 8 | uint64_t(op.block) << 16 |
            uint64_t(op.phase) << 24 | uint64_t(op.collective) << 32 | uint64_t(op.group) << 40 |
            uint64_t(op.category) << 48);
      const auto [tp, tp_big] = group_degrees(op);
      x.add(tp | tp_big << 8 | uint64_t(uint16_t(op.chunk)) << 16);
      x.add(uint64_t(uint32_t(op.layer)) | uint64_t(uint32_t(op.microbatch)) << 32);
      x.add(uint64_t(uint32_t(op.samples)) | uint64_t(uint32_t(op.buffer)) << 32);
      x.add(uint64_t(op.bytes));
      // What an op carries besides its shape: its purpose, precision, kernel, recompute and cp
      // part, and its layer's strategy.
      x.add(uint64_t(op.purpose) | uint64_t(op.dtype) << 8 | uint64_t(op.flash_attention) << 16 |
            uint64_t(op.recompute) << 24 | uint64_t(op.part) << 32 |
            uint64_t(uint16_t(op.cp_step)) << 40 | uint64_t(op.wgrad_deferred) << 56);
      const OpStrategy& s = op.strategy;
      x.add(uint64_t(uint32_t(s.tp)) | uint64_t(uint32_t(s.dp)) << 32);
      x.add(uint64_t(uint32_t(s.cp)) | uint64_t(uint32_t(s.ep)) << 32);
      x.add(uint64_t(uint32_t(s.etp)) | uint64_t(s.zero) << 32 | uint64_t(s.cp_kind) << 40 |
            uint64_t(s.sequence_parallel) << 48 | uint64_t(s.offload_optimizer) << 49 |
            uint64_t(s.offload_params) << 50 | uint64_t(s.offload_activations) << 51);
      uint64_t load;
      std::memcpy(&load, &s.expert_load, sizeof load);
      x.add(load ^ uint64_t(uint32_t(s.moe_node_limit)));
      x.add(uint64_t(uint32_t(op.reshard_from_tp)) | uint64_t(uint32_t(op.reshard_to_tp)) << 32);
      uint64_t f;
      std::memcpy(&f, &op.flops, sizeof f);
      x.add(f);
      x.add(op.dep_count);
      for (uint32_t k = 0; k < op.dep_count; ++k) x.add(sp.deps_of(op)[k]);
    }
  }
  return x.h;
}

struct Case {
  const char* name;
  const char* model;
  int nodes;
  PlanShorthand s;
  uint64_t expected;
};

Plan plan_of(const Case& c, const ModelSpec& m) {
  ClusterSpec cl = load_cluster("dgx-a100-80g");
  cl.nodes = c.nodes;
  return expand_shorthand(c.s, m, cl);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&](const char* name, const char* model, int nodes, auto set, uint64_t expected) {
    Case c{name, model, nodes, {}, expected};
    set(c.s);
    out.push_back(c);
  };
  add(
      "gpt3 pp16 interleaved v2 tp4 sp selective", "gpt3-175b", 8,
      [](PlanShorthand& s) {
        s.tp = 4, s.pp = 16, s.dp = 1, s.vpp = 2, s.micro_batch = 1, s.global_batch = 1536;
        s.schedule = "interleaved", s.sequence_parallel = true, s.recompute = "selective";
      },
      0x028fe6bd67aaa457ull);
  add(
      "gpt3 pp8 1f1b tp4 dp2 z1 sp", "gpt3-175b", 8,
      [](PlanShorthand& s) {
        s.tp = 4, s.pp = 8, s.dp = 2, s.micro_batch = 1, s.global_batch = 256, s.zero = 1;
        s.sequence_parallel = true, s.recompute = "selective";
      },
      0x84a5a7c3eb506e2full);
  add(
      "gpt2 gpipe pp4 z3 offload all, full recompute", "gpt2-124m", 2,
      [](PlanShorthand& s) {
        s.tp = 1, s.pp = 4, s.micro_batch = 2, s.global_batch = 64, s.zero = 3;
        s.schedule = "gpipe", s.recompute = "full", s.offload = "optimizer,params,activations";
      },
      0x3affc6468da15387ull);
  add(
      "gpt2 1f1b tp2 pp2 z2 no overlap no prefetch", "gpt2-124m", 2,
      [](PlanShorthand& s) {
        s.tp = 2, s.pp = 2, s.micro_batch = 1, s.global_batch = 32, s.zero = 2;
        s.no_overlap_grad_reduce = true, s.no_backward_prefetch = true;
      },
      0xb5b2123212872f0aull);
  add(
      "gpt2 interleaved pp2 v3 tp2 sp z3 offload activations", "gpt2-124m", 2,
      [](PlanShorthand& s) {
        s.tp = 2, s.pp = 2, s.vpp = 3, s.micro_batch = 1, s.global_batch = 32, s.zero = 3;
        s.sequence_parallel = true, s.offload = "activations";
      },
      0x91dd033d7a163728ull);
  add(
      "gpt2 zb-h1 pp4 dp2 z1", "gpt2-124m", 2,
      [](PlanShorthand& s) {
        s.tp = 1, s.pp = 4, s.dp = 4, s.micro_batch = 1, s.global_batch = 48, s.zero = 1;
        s.schedule = "zb-h1";
      },
      0xd321d11eac590fbcull);
  add(
      "gpt2 zb-h2 pp2 tp2 sp full recompute", "gpt2-124m", 2,
      [](PlanShorthand& s) {
        s.tp = 2, s.pp = 2, s.micro_batch = 2, s.global_batch = 32, s.sequence_parallel = true;
        s.schedule = "zb-h2", s.recompute = "full";
      },
      0x0b92c7e27b5927ddull);
  add(
      "llama2-7b (untied, GQA) 1f1b tp2 pp4 z1", "llama2-7b", 2,
      [](PlanShorthand& s) {
        s.tp = 2, s.pp = 4, s.micro_batch = 1, s.global_batch = 16, s.zero = 1;
      },
      0x46d2ff6b3152cc73ull);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(op_streams_match_their_recorded_hashes) {
  for (const Case& c : cases()) {
    BOOST_TEST_CONTEXT(c.name) {
      const ModelSpec m = load_model(c.model);
      const uint64_t h = hash_program(build_program(m, plan_of(c, m)));
      std::printf("%s: 0x%016llxull\n", c.name, static_cast<unsigned long long>(h));
      BOOST_TEST(h == c.expected);
    }
  }
}

// A heterogeneous plan: every per-layer field differs between layers, and dp changes between
// neighbours (reshards).
BOOST_AUTO_TEST_CASE(heterogeneous_op_stream_matches_its_recorded_hash) {
  const ModelSpec m = load_model("gpt3-1.3b");
  Case c{"heterogeneous", "gpt3-1.3b", 2, {}, 0};
  c.s.tp = 2, c.s.pp = 2, c.s.micro_batch = 1, c.s.global_batch = 32;
  Plan p = plan_of(c, m);
  auto& L = p.layers;
  const LayerStrategy pattern[] = {
      {1, 8, false, 0, Recompute::none, false, false, false},
      {4, 2, true, 3, Recompute::full, false, false, false},
      {2, 4, false, 2, Recompute::selective, true, false, true},
      {8, 1, true, 0, Recompute::none, false, false, false},
      {2, 4, false, 1, Recompute::full, false, true, false},
      {4, 2, false, 3, Recompute::none, true, true, true},
  };
  for (size_t l = 0; l < L.size(); ++l) L[l] = pattern[l % 6];
  p.chunks = {{0, 5}, {5, int(L.size())}};
  ClusterSpec cl = load_cluster("dgx-a100-80g");
  cl.nodes = 2;
  validate(p, m, cl, "heterogeneous");
  const uint64_t h = hash_program(build_program(m, p));
  std::printf("heterogeneous: 0x%016llxull\n", static_cast<unsigned long long>(h));
  BOOST_TEST(h == 0xe10bef55cc40d69aull);
}
