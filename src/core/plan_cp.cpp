// Validation of a plan's context parallelism (validate calls it after the per-layer checks).
#include <string>

#include "stratagem/error.hpp"
#include "stratagem/plan.hpp"

namespace stratagem {

std::string cp_refusal(const ModelSpec& m, const LayerStrategy& l, bool flash, std::string* field) {
  auto no = [&](const char* f, const std::string& why) {
    if (field) *field = f;
    return why;
  };
  if (l.cp < 1) return no("cp", "expected >= 1, got " + std::to_string(l.cp));
  if (l.cp == 1) return "";
  const std::string n = std::to_string(l.cp), seq = std::to_string(m.seq_len);
  if (m.attention == AttentionKind::mla)
    return no("cp",
              "context parallelism of MLA attention is not supported (its K and V come from a "
              "shared latent that none of ring, allgather, a2a moves)");
  // Selective recompute without flash attention rebuilds the probabilities from the saved Q
  // and K alone: under cp the K/V of the other ranks would have to move again.
  if (l.recompute == Recompute::selective && !flash)
    return no("recompute",
              "selective recompute with cp > 1 needs flash_attention (the attention "
              "probabilities would be rebuilt from other ranks' K, V)");
  switch (l.cp_kind) {
    case CpKind::ring:
      // Megatron-Core's load balance: 2 x cp chunks, rank i holding chunks i and 2cp-1-i, so
      // that every rank has the same share of the causal triangle.
      if (m.seq_len % (2 * l.cp))
        return no("cp", "the ring cuts the sequence into 2 x cp = " + std::to_string(2 * l.cp) +
                            " chunks, which do not divide seq_len " + seq);
      break;
    case CpKind::allgather:
      if (m.seq_len % l.cp) return no("cp", "cp " + n + " does not divide seq_len " + seq);
      break;
    case CpKind::a2a: {
      if (m.seq_len % l.cp) return no("cp", "cp " + n + " does not divide seq_len " + seq);
      // DeepSpeed-Ulysses trades the sequence split for a head split: each of the cp x tp
      // ranks of a sequence takes whole heads, query and key/value alike.
      const int64_t split = int64_t(l.cp) * l.tp;
      if (m.heads % split)
        return no("cp_kind", "a2a splits heads over cp x tp = " + std::to_string(split) +
                                 " ranks, which do not divide heads (" + std::to_string(m.heads) +
                                 ")");
      if (m.kv_heads % split)
        return no("cp_kind", "a2a splits heads over cp x tp = " + std::to_string(split) +
                                 " ranks, which do not divide kv_heads (" +
                                 std::to_string(m.kv_heads) + ")");
      break;
    }
  }
  // Sequence parallelism splits each cp rank's tokens over its tp group.
  if (l.sequence_parallel && (m.seq_len / l.cp) % l.tp)
    return no("sequence_parallel", "tp " + std::to_string(l.tp) +
                                       " does not divide the seq_len / cp = " +
                                       std::to_string(m.seq_len / l.cp) + " tokens of a rank");
  return "";
}

void validate_context_parallel(const Plan& p, const ModelSpec& m, const std::string& src) {
  auto bad = [&](const std::string& field, const std::string& what) {
    throw InputError(src + ": " + field + ": " + what);
  };
  const LayerStrategy& e = p.embedding;
  auto check = [&](const LayerStrategy& l, const std::string& at) {
    // The residual stream is cut along the sequence from the embedding to the head: a layer
    // cannot hold it cut differently (no reshard between cp degrees is modelled).
    if (l.cp != e.cp && l.cp >= 1)
      bad(at + ".cp", "cp " + std::to_string(l.cp) + " differs from the embedding's cp " +
                          std::to_string(e.cp) + " (every layer and the embedding take one cp)");
    if (l.cp > 1 && (l.tp != e.tp || l.sequence_parallel != e.sequence_parallel))
      bad(at + ".tp",
          "with cp > 1 every layer and the embedding take one tp and sequence_parallel (a "
          "reshard between tp degrees inside a context-parallel group is not modelled)");
    std::string field;
    const std::string why = cp_refusal(m, l, p.flash_attention, &field);
    if (!why.empty()) bad(at + "." + field, why);
  };
  check(e, "embedding");
  for (size_t k = 0; k < p.layers.size(); ++k)
    check(p.layers[k], "layers[" + std::to_string(k) + "]");
}

}  // namespace stratagem
