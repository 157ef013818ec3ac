// What the runtime refuses before any work: features of the search's space it does not
// execute yet, models that do not fit the plan, and offloading beyond the node's host memory.
#include <algorithm>
#include <cstdio>
#include <string>

#include "src/runtime/rank_plan.hpp"
#include "stratagem/error.hpp"
#include "stratagem/executor.hpp"

namespace stratagem {

namespace {
// Every rank of a node offloads into the same host memory: a plan whose offloaded states and
// activations (as the executor holds them, with the Program the run builds) do not fit there
// is refused before any work, naming the pool and the numbers.
void check_host_pool(const ModelSpec& m, const Plan& p, const ClusterSpec& c,
                     const FrameworkSpec& framework) {
  const LayerStrategy& e = p.embedding;
  bool on_host = e.offload_params || e.offload_optimizer;
  for (const LayerStrategy& s : p.layers)
    on_host = on_host || s.offload_params || s.offload_optimizer || s.offload_activations;
  if (c.node.host_memory_bytes <= 0 || !on_host) return;
  const TransformerConfig whole = transformer_config(m);
  const Program prog = build_program(m, p, framework);
  const int64_t f = sizeof(float);
  int64_t per_rank = 0, states_max = 0, acts_max = 0;
  for (int stage = 0; stage < p.pp; ++stage) {
    // As the executor holds them (its first data-parallel rank's pieces).
    const ModelPart part = exec::stage_part(p, stage, 0);
    const std::vector<int> held = part.layer_list(whole.layers);
    const exec::Sharding sh =
        exec::make_sharding(make_param_table(whole, part), exec::segment_placements(p, held), 0);
    // Offloaded weights; offloaded optimizer state: moments, the gradients handed down, and a
    // master copy of the weights that stay on the device.
    int64_t states = (sh.host_weights.size() + 3 * sh.host_state.size()) * f;
    for (const FlatRun& r : sh.host_state.runs())
      if (sh.weights.holds(r.flat_begin)) states += (r.flat_end - r.flat_begin) * f;
    int64_t acts = 0, acts_peak = 0;  // the Program's activation copies, in its order
    for (const Op& op : prog.stages[stage].ops) {
      if (op.category != MemCategory::activations) continue;
      if (op.kind == OpKind::copy_d2h) acts += op.bytes;
      if (op.kind == OpKind::copy_h2d) acts -= op.bytes;
      acts_peak = std::max(acts_peak, acts);
    }
    if (states + acts_peak > per_rank)
      per_rank = states + acts_peak, states_max = states, acts_max = acts_peak;
  }
  const int per_node = std::min(c.node.gpus_per_node, p.world_size());
  if (per_rank * per_node <= c.node.host_memory_bytes) return;
  auto gib = [](int64_t b) {
    char s[32];
    std::snprintf(s, sizeof s, "%.4g", double(b) / double(1LL << 30));
    return std::string(s);
  };
  throw InputError("host pool: the plan offloads " + gib(per_rank) + " GiB per rank (states " +
                   gib(states_max) + ", activations " + gib(acts_max) + ") x " +
                   std::to_string(per_node) + " ranks per node, more than the node's " +
                   gib(c.node.host_memory_bytes) + " GiB of host memory (cluster " + c.name +
                   ", node.host_memory_bytes)");
}
}  // namespace

// Features of the search's space that the runtime does not execute yet, named for the user.
void check_runnable(const ModelSpec& m, const Plan& p, const ClusterSpec& cluster,
                    const std::string& backend, const std::string& framework) {
  // Per-layer strategies: where consecutive layers hold the stream differently
  // (LayerStrategy::stream_tp: (tp, dp), sequence parallelism), activations and gradients are
  // resharded by the Program's reshard all-gathers (or sliced where its replicas shrink),
  // from the embedding into the first layer and from the last into the LM head too.
  const size_t n = p.layers.size();
  for (size_t l = 0; l <= n; ++l) {
    const LayerStrategy& prev = l == 0 ? p.embedding : p.layers[l - 1];
    const LayerStrategy& s = l < n ? p.layers[l] : p.embedding;
    const int a = prev.stream_tp(), b = s.stream_tp();
    if (a % b && b % a)
      throw InputError((l < n ? "layer " + std::to_string(l) : std::string("the LM head")) + " (" +
                       s.describe() + "): tp does not divide the previous layer's (" +
                       prev.describe() + ") nor is divided by it: no reshard group");
    transformer_config(m).sharded(s.tp);
  }
  // Context parallelism: the sequence is split once, for the embedding, every layer and the
  // head alike (a change of cp between layers would reshard the stream, which no op does).
  const int cp = p.embedding.cp;
  for (size_t l = 0; l < n; ++l)
    if (p.layers[l].cp != cp)
      throw NotSupported("layer " + std::to_string(l) + " (" + p.layers[l].describe() +
                         "): cp differs from the embedding's (" + std::to_string(cp) +
                         "); the runtime splits the sequence once for the whole model");
  if (cp > 1 && m.seq_len % (2 * cp) != 0)
    throw InputError("seq_len " + std::to_string(m.seq_len) +
                     " does not split into 2 x cp = " + std::to_string(2 * cp) + " equal chunks");
  if (cp > 1 && backend != "cpu")
    throw NotSupported("context parallelism on the " + backend +
                       " backend (block attention, its merge and RoPE from a position) is not "
                       "built yet; the cpu backend runs it");
  // Mixture-of-Experts: the runtime runs MoE layers under tp (each tp rank routes its token
  // slice), ep and etp, each layer its own (the Layout holds the groups of every (etp, ep)
  // pair), without context parallelism; their experts' ZeRO over the expert data-parallel
  // group as any layer's (staged gradients, the ZeRO-3 gather before their compute).
  for (size_t l = 0; l < n; ++l) {
    const LayerStrategy& s = p.layers[l];
    if (!m.is_moe_layer(int(l))) continue;
    const std::string where = "layer " + std::to_string(l) + " (" + s.describe() + "): ";
    if (m.moe.expert_groups > 1)
      throw NotSupported(where + "group-limited routing (moe.expert_groups " +
                         std::to_string(m.moe.expert_groups) +
                         ") is not run by the runtime yet (issue #26)");
    if (s.cp != 1)
      throw NotSupported(where +
                         "context parallelism of MoE layers (routing each cp rank's sequence "
                         "chunks) is not run by the runtime yet (issue #26)");
  }
  bool offloads = false;
  for (const LayerStrategy& s : p.layers)
    offloads = offloads || s.offload_optimizer || s.offload_params || s.offload_activations;
  // The host pool and the copy streams are host memory and memcpy: a device backend needs
  // pinned memory and its own copy streams first.
  if (backend != "cpu" && offloads)
    throw NotSupported("offloading on the " + backend +
                       " backend (pinned host pool and copy streams) is not built yet; the cpu "
                       "backend runs it");
  if (backend == "cpu" && p.dtype != Dtype::fp32)
    throw NotSupported(std::string("dtype ") + to_string(p.dtype) +
                       ": the cpu backend computes in fp32 (plan dtype fp32)");
  transformer_config(m).sharded(p.embedding.tp);  // heads, kv heads and ffn divide by tp
  check_host_pool(m, p, cluster, exec::runtime_framework(framework, p));
}

}  // namespace stratagem
