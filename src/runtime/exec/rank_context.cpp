// What the ops ask of the rank's context (rank_context.hpp): a micro-batch's state (with its
// samples, drawn at its first use), an op's communicator, and which of the rank's parameter
// segments an op touches and which tensors its weight fetch binds.
#include "src/runtime/exec/rank_context.hpp"

#include <string>
#include <vector>

#include "src/runtime/context_parallel.hpp"
#include "stratagem/error.hpp"

namespace stratagem::exec {

Micro& RankContext::mb(int m) {
  const LayerShare& sh = share(-1);  // the embedding and head's
  auto [it, fresh] = current_step.micro.try_emplace(m);
  Micro& s = it->second;
  if (fresh && (stage == 0 || stage == plan.pp - 1)) {
    // This rank's samples of micro-batch m, indexed globally so that any layout sees the same
    // global batch; under context parallelism, the rows of its two chunks of each.
    s.tokens.resize(size_t(sh.tokens));
    s.targets.resize(size_t(sh.tokens));
    const int whole_len = model_spec.seq_len;
    std::vector<int32_t> tokens(static_cast<size_t>(whole_len)),
        targets(static_cast<size_t>(whole_len));
    const std::vector<int64_t> rows = sequence.split()
                                          ? cp_positions(sequence.cp_rank, sequence.cp, whole_len)
                                          : std::vector<int64_t>{};
    for (int i = 0; i < sh.samples; ++i) {
      const int64_t index = int64_t(m) * sh.samples * sh.dp + int64_t(sh.dp_index) * sh.samples + i;
      if (!sequence.split()) {
        samples.sample(current_step.index, index, T, s.tokens.data() + size_t(i) * T,
                       s.targets.data() + size_t(i) * T);
        continue;
      }
      samples.sample(current_step.index, index, whole_len, tokens.data(), targets.data());
      for (int t = 0; t < T; ++t) {
        s.tokens[size_t(i) * T + t] = tokens[size_t(rows[t])];
        s.targets[size_t(i) * T + t] = targets[size_t(rows[t])];
      }
    }
    const int64_t begin = sh.local.vocab_begin(sh.tp_index),
                  valid = sh.local.vocab_valid(sh.tp_index);
    s.ids.resize(s.tokens.size());
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (s.tokens[i] < 0 || s.tokens[i] >= whole.vocab)
        throw InputError("token id " + std::to_string(s.tokens[i]) + " outside the vocabulary");
      const int64_t id = s.tokens[i] - begin;
      s.ids[i] = id >= 0 && id < valid ? static_cast<int32_t>(id) : -1;
    }
  }
  return s;
}

Communicator& RankContext::group_of(const Op& op) {
  return parallel.group(resolve_group(parallel.layout(), parallel.rank(), op));
}

int RankContext::segment_key(const Op& op) const {
  // The experts' reductions and gathers (expert_dp), and the buffers and copies of their fetch.
  const bool experts = op.group == GroupKind::expert_dp ||
                       (op.block == Block::experts && op.group == GroupKind::none);
  return experts ? expert_segment(op.layer) : op.layer;
}

std::vector<const ParamInfo*> RankContext::fetch_set(const Op& op, Micro* m) const {
  std::vector<const ParamInfo*> out;
  const std::string prefix = "layers." + std::to_string(op.layer) + ".";
  // Layer -1: the lookup's weights before the micro-batch's embedding has run on this stage,
  // the head's afterwards (the Program fetches them apart).
  const bool lookup = op.layer < 0 && stage == 0 && m && !m->embedded;
  // An MoE layer's experts apart from it are fetched on their own (Block::experts), not with
  // the rest of the layer.
  const bool apart = op.layer >= 0 && shards.sharding.segments.count(expert_segment(op.layer));
  const bool experts = op.block == Block::experts;
  for (const ParamInfo& e : shards.model.table.entries()) {
    if (op.layer >= 0 && apart && is_expert_param(e.name) != experts) continue;
    const bool in = op.layer >= 0 ? e.name.rfind(prefix, 0) == 0
                    : lookup      ? e.name == "wte" || e.name == "wpe"
                                  : e.name.rfind("norm_f.", 0) == 0 || e.name == "lm_head.weight" ||
                                   (e.name == "wte" && whole.tied_embeddings);
    if (in) out.push_back(&e);
  }
  return out;
}

}  // namespace stratagem::exec
