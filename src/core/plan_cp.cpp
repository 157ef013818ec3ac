// Validation of a plan's context parallelism (validate calls it after the per-layer checks).
#include <string>

#include "stratagem/error.hpp"
#include "stratagem/plan.hpp"

namespace stratagem {

void validate_context_parallel(const Plan& p, const ModelSpec& m, const std::string& src) {
  auto bad = [&](const std::string& field, const std::string& what) {
    throw InputError(src + ": " + field + ": " + what);
  };
  const LayerStrategy& e = p.embedding;
  auto check = [&](const LayerStrategy& l, const std::string& at) {
    const std::string n = std::to_string(l.cp);
    if (l.cp < 1) bad(at + ".cp", "expected >= 1, got " + n);
    // The residual stream is cut along the sequence from the embedding to the head: a layer
    // cannot hold it cut differently (no reshard between cp degrees is modelled).
    if (l.cp != e.cp)
      bad(at + ".cp", "cp " + n + " differs from the embedding's cp " + std::to_string(e.cp) +
                          " (every layer and the embedding take one cp)");
    if (l.cp == 1) return;
    if (l.tp != e.tp || l.sequence_parallel != e.sequence_parallel)
      bad(at + ".tp",
          "with cp > 1 every layer and the embedding take one tp and sequence_parallel (a "
          "reshard between tp degrees inside a context-parallel group is not modelled)");
    if (m.attention == AttentionKind::mla)
      bad(at + ".cp",
          "context parallelism of MLA attention is not supported (its K and V come "
          "from a shared latent that none of ring, allgather, a2a moves)");
    // Selective recompute without flash attention rebuilds the probabilities from the saved Q
    // and K alone: under cp the K/V of the other ranks would have to move again.
    if (l.recompute == Recompute::selective && !p.flash_attention)
      bad(at + ".recompute",
          "selective recompute with cp > 1 needs flash_attention (the "
          "attention probabilities would be rebuilt from other ranks' K, V)");
    const std::string seq = std::to_string(m.seq_len);
    switch (l.cp_kind) {
      case CpKind::ring:
        // Megatron-Core's load balance: 2 x cp chunks, rank i holding chunks i and 2cp-1-i, so
        // that every rank has the same share of the causal triangle.
        if (m.seq_len % (2 * l.cp))
          bad(at + ".cp", "the ring cuts the sequence into 2 x cp = " + std::to_string(2 * l.cp) +
                              " chunks, which do not divide seq_len " + seq);
        break;
      case CpKind::allgather:
        if (m.seq_len % l.cp) bad(at + ".cp", "cp " + n + " does not divide seq_len " + seq);
        break;
      case CpKind::a2a: {
        if (m.seq_len % l.cp) bad(at + ".cp", "cp " + n + " does not divide seq_len " + seq);
        // DeepSpeed-Ulysses trades the sequence split for a head split: each of the cp x tp
        // ranks of a sequence takes whole heads, query and key/value alike.
        const int64_t split = int64_t(l.cp) * l.tp;
        if (m.heads % split)
          bad(at + ".cp_kind", "a2a splits heads over cp x tp = " + std::to_string(split) +
                                   " ranks, which do not divide heads (" + std::to_string(m.heads) +
                                   ")");
        if (m.kv_heads % split)
          bad(at + ".cp_kind", "a2a splits heads over cp x tp = " + std::to_string(split) +
                                   " ranks, which do not divide kv_heads (" +
                                   std::to_string(m.kv_heads) + ")");
        break;
      }
    }
    // Sequence parallelism splits each cp rank's tokens over its tp group.
    if (l.sequence_parallel && (m.seq_len / l.cp) % l.tp)
      bad(at + ".sequence_parallel", "tp " + std::to_string(l.tp) +
                                         " does not divide the seq_len / cp = " +
                                         std::to_string(m.seq_len / l.cp) + " tokens of a rank");
  };
  check(e, "embedding");
  for (size_t k = 0; k < p.layers.size(); ++k)
    check(p.layers[k], "layers[" + std::to_string(k) + "]");
}

}  // namespace stratagem
