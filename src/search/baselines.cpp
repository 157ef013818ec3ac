// The baseline spaces: uniform Megatron-style plans and ZeRO-3 data parallelism.
#include "src/search/searcher.hpp"

namespace stratagem::search_detail {

std::vector<Plan> megatron_plans(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o) {
  std::vector<Plan> out;
  const int world = c.world_size();
  const int g = std::max(1, c.node.gpus_per_node);
  for (int pp : pp_list(m, c, o)) {
    const int D = world / pp;
    for (int tp = 1; tp <= g && tp <= D; tp *= 2) {
      if (D % tp || m.heads % tp || m.kv_heads % tp || m.ffn_hidden % tp) continue;
      if (!o.tp_degrees.empty() && !contains(o.tp_degrees, tp)) continue;
      if (m.attention == AttentionKind::mla && tp > 1) continue;  // not split over tp yet
      const int dp = D / tp;
      for (int mb = 1; mb <= o.max_samples_per_rank; ++mb) {
        // Products of degrees and batch sizes in int64: mb x dp passes int's range on a large
        // cluster (2^26 ranks x 64), and wrapped to 0 it was a divisor.
        const int64_t Bm64 = int64_t(mb) * dp;
        if (Bm64 > o.global_batch || o.global_batch % Bm64) continue;
        const int Bm = int(Bm64);  // <= the global batch: an int
        if (!o.micro_batches.empty() && !contains(o.micro_batches, Bm)) continue;
        const int M = o.global_batch / Bm;
        std::vector<std::pair<Schedule, int>> scheds;
        if (contains(o.schedules, Schedule::one_f_one_b))
          scheds.push_back({Schedule::one_f_one_b, 1});
        if (contains(o.schedules, Schedule::interleaved) && pp >= 2 && M >= pp)
          for (int v : o.vpp_degrees)
            if (v >= 2 && pp * v <= m.layers) scheds.push_back({Schedule::interleaved, v});
        for (auto [sch, v] : scheds)
          for (Recompute rc : o.recompute)
            for (int sp = 0; sp < 2; ++sp) {
              if (sp && (tp == 1 || !o.sequence_parallel_on || m.seq_len % tp)) continue;
              if (!sp && tp > 1 && !o.sequence_parallel_off) continue;
              for (int z : {0, 1}) {
                if (!contains(o.zero_stages, z) || (z == 1 && dp == 1)) continue;
                LayerStrategy l;
                l.tp = tp, l.dp = dp, l.sequence_parallel = sp, l.zero = z, l.recompute = rc;
                LayerStrategy emb = l;
                emb.recompute = Recompute::none;
                std::vector<int> totals(pp, 0);
                const auto ch = even_chunks(m.layers, pp * v);
                for (int k = 0; k < pp * v; ++k) totals[k % pp] += ch[k].size();
                std::vector<std::vector<LayerStrategy>> seqs(pp);
                for (int s = 0; s < pp; ++s) seqs[s].assign(totals[s], l);
                Plan base = assemble(m, o, pp, sch, v, Bm, totals, seqs, emb);
                // An MoE model: Megatron-Core's expert parallelism over its MoE layers too
                // (etp = tp, its default), each ep a power of two dividing the experts.
                // (ep in int64: doubling past 2^30 experts must not wrap.)
                for (int64_t ep = 2; m.moe.enabled() && ep <= m.moe.experts; ep *= 2) {
                  if (m.moe.experts % ep || D % (tp * ep)) continue;
                  Plan q = base;
                  for (int k = 0; k < m.layers; ++k)
                    if (m.is_moe_layer(k)) q.layers[k].ep = int(ep), q.layers[k].etp = tp;
                  out.push_back(std::move(q));
                }
                if (m.moe.enabled() && tp > 1)
                  for (int k = 0; k < m.layers; ++k)
                    if (m.is_moe_layer(k)) base.layers[k].etp = tp;
                out.push_back(std::move(base));
              }
            }
      }
    }
  }
  return out;
}

std::vector<Plan> zero_plans(const ModelSpec& m, const ClusterSpec& c, const SearchOptions& o) {
  std::vector<Plan> out;
  // DeepSpeed's engine refuses ZeRO-3 on a model with MoE layers (deepspeed/runtime/engine.py:
  // "MoE not supported with Stage 3"): this baseline has no plan for one.
  if (m.moe.enabled()) return out;
  const int world = c.world_size();
  if (!o.pp_degrees.empty() && !contains(o.pp_degrees, 1)) return out;
  if (!o.tp_degrees.empty() && !contains(o.tp_degrees, 1)) return out;
  if (!contains(o.schedules, Schedule::one_f_one_b)) return out;
  const int z = world > 1 ? 3 : 0;  // ZeRO without data parallelism changes nothing
  if (!contains(o.zero_stages, z)) return out;
  for (int mb = 1; mb <= o.max_samples_per_rank; ++mb) {
    const int64_t Bm64 = int64_t(mb) * world;  // as in megatron_plans: no wrap to 0
    if (Bm64 > o.global_batch || o.global_batch % Bm64) continue;
    const int Bm = int(Bm64);
    if (!o.micro_batches.empty() && !contains(o.micro_batches, Bm)) continue;
    for (Recompute rc : o.recompute)
      // DeepSpeed: ZeRO-Offload (optimizer), ZeRO-Infinity (+ parameters), and CPU
      // checkpointing of the activations kept by full recompute.
      for (int off = 0; off < (o.offload ? 3 : 1); ++off)
        for (int act = 0; act < ((o.offload && rc == Recompute::full) ? 2 : 1); ++act) {
          LayerStrategy l;
          l.tp = 1, l.dp = world, l.zero = z, l.recompute = rc;
          l.offload_optimizer = off >= 1;
          l.offload_params = off >= 2;
          l.offload_activations = act;
          LayerStrategy emb = l;
          emb.recompute = Recompute::none;
          emb.offload_activations = false;
          std::vector<std::vector<LayerStrategy>> seqs{std::vector<LayerStrategy>(m.layers, l)};
          out.push_back(assemble(m, o, 1, Schedule::one_f_one_b, 1, Bm, {m.layers}, seqs, emb));
        }
  }
  return out;
}

void Searcher::baselines() {
  const bool full = o_.space == SearchSpace::full;
  if (full ? o_.baselines : o_.space == SearchSpace::megatron) {
    const auto plans = megatron_plans(m_, c_, o_);
    progress_done_ = 0;
    progress_total_ = int64_t((plans.size() + procs_ - 1) / procs_);
    for (size_t i = rank_; i < plans.size(); i += procs_) {
      // The megatron baseline is the best uniform plan without expert parallelism; the
      // expert-parallel ones compete in the full space.
      bool ep = false;
      for (const auto& l : plans[i].layers) ep = ep || l.ep > 1;
      consider(plans[i], "megatron", ep ? &megatron_ep_ : &megatron_);
      tick("baseline plans");
    }
  }
  if (full ? o_.baselines : o_.space == SearchSpace::zero) {
    const auto plans = zero_plans(m_, c_, o_);
    for (size_t i = rank_; i < plans.size(); i += procs_) {
      consider(plans[i], "zero", &zero_);
      tick("baseline plans");
    }
  }
}

}  // namespace stratagem::search_detail
