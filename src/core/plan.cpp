#include "stratagem/plan.hpp"

#include <algorithm>
#include <sstream>

#include "stratagem/error.hpp"
#include "stratagem/limits.hpp"
#include "stratagem/schedule.hpp"

namespace stratagem {

const char* to_string(Schedule s) {
  switch (s) {
    case Schedule::gpipe:
      return "gpipe";
    case Schedule::one_f_one_b:
      return "1f1b";
    case Schedule::interleaved:
      return "interleaved";
    case Schedule::zb_h1:
      return "zb-h1";
    case Schedule::zb_h2:
      return "zb-h2";
  }
  return "?";
}

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::none:
      return "none";
    case Recompute::selective:
      return "selective";
    case Recompute::full:
      return "full";
  }
  return "?";
}

Schedule schedule_from(const std::string& s, const std::string& where) {
  if (s == "gpipe") return Schedule::gpipe;
  if (s == "1f1b") return Schedule::one_f_one_b;
  if (s == "interleaved") return Schedule::interleaved;
  if (s == "zb-h1") return Schedule::zb_h1;
  if (s == "zb-h2") return Schedule::zb_h2;
  throw InputError(where + ": expected gpipe|1f1b|interleaved|zb-h1|zb-h2, got '" + s + "'");
}
Recompute recompute_from(const std::string& s, const std::string& where) {
  if (s == "none") return Recompute::none;
  if (s == "selective") return Recompute::selective;
  if (s == "full") return Recompute::full;
  throw InputError(where + ": expected none|selective|full, got '" + s + "'");
}

const char* to_string(CpKind k) {
  switch (k) {
    case CpKind::ring:
      return "ring";
    case CpKind::allgather:
      return "allgather";
    case CpKind::a2a:
      return "a2a";
  }
  return "?";
}

CpKind cp_kind_from(const std::string& s, const std::string& where) {
  if (s == "ring") return CpKind::ring;
  if (s == "allgather") return CpKind::allgather;
  if (s == "a2a") return CpKind::a2a;
  throw InputError(where + ": expected ring|allgather|a2a, got '" + s + "'");
}

std::string LayerStrategy::describe() const {
  std::ostringstream os;
  os << "tp" << tp;
  if (cp > 1) os << " cp" << cp << "-" << to_string(cp_kind);
  os << " dp" << dp;
  if (sequence_parallel) os << " sp";
  if (ep > 1) os << " ep" << ep;
  if (etp > 1) os << " etp" << etp;
  if (zero) os << " z" << zero;
  if (recompute != Recompute::none) os << " rc=" << to_string(recompute);
  if (offload_optimizer || offload_params || offload_activations) {
    os << " off=";
    if (offload_optimizer) os << "o";
    if (offload_params) os << "p";
    if (offload_activations) os << "a";
  }
  return os.str();
}

int Plan::devices_per_stage() const {
  const LayerStrategy& l = layers.empty() ? embedding : layers.front();
  return l.tp * l.cp * l.dp;
}

int Plan::max_dp() const {
  int d = embedding.dp;
  for (const auto& l : layers) d = std::max(d, l.dp);
  return d;
}

int Plan::num_microbatches() const {
  return global_batch / (micro_batch * max_dp());
}

int Plan::microbatch_group_size(int microbatches) const {
  return microbatch_group > 0 ? microbatch_group : interleaved_group(pp, microbatches);
}

bool Plan::uniform() const {
  for (const auto& l : layers)
    if (!(l == layers.front())) return false;
  return true;
}

std::string Plan::describe() const {
  std::ostringstream os;
  os << "pp" << pp << " " << to_string(schedule);
  if (schedule == Schedule::interleaved) os << " v" << vpp;
  if (microbatch_group > 0) os << " g" << microbatch_group;
  os << " mb" << micro_batch << " x" << num_microbatches() << " | ";
  if (uniform() && !layers.empty()) {
    os << layers.front().describe();
  } else {
    // Runs of equal strategies: "0-11:tp8 dp1, 12-23:tp4 dp2".
    size_t i = 0;
    bool first = true;
    while (i < layers.size()) {
      size_t j = i;
      while (j + 1 < layers.size() && layers[j + 1] == layers[i]) ++j;
      os << (first ? "" : ", ") << i << "-" << j << ":" << layers[i].describe();
      first = false;
      i = j + 1;
    }
  }
  return os.str();
}

std::vector<LayerRange> even_chunks(int layers, int chunks) {
  std::vector<LayerRange> out;
  int base = layers / chunks, extra = layers % chunks, at = 0;
  for (int c = 0; c < chunks; ++c) {
    int n = base + (c < extra ? 1 : 0);
    out.push_back({at, at + n});
    at += n;
  }
  return out;
}

bool PlanShorthand::any() const {
  return tp || pp || dp || cp || cp_kind || micro_batch || global_batch || vpp || zero ||
         recompute || schedule || dtype || offload || sequence_parallel || flash_attention ||
         no_overlap_grad_reduce || no_backward_prefetch || ep || etp || moe_node_limit ||
         routing_imbalance || capacity_factor || microbatch_group;
}

namespace {
// --offload optimizer,params,activations or none. An empty item ('', ',', 'params,') names
// nothing: refused rather than read as no offload.
void apply_offload(const std::string& list, LayerStrategy& l) {
  for (size_t at = 0;;) {
    const size_t comma = list.find(',', at);
    const std::string item = list.substr(at, comma == std::string::npos ? comma : comma - at);
    if (item == "optimizer")
      l.offload_optimizer = true;
    else if (item == "params")
      l.offload_params = true;
    else if (item == "activations")
      l.offload_activations = true;
    else if (item != "none")
      throw InputError(
          "--offload: expected a comma list of optimizer, params, activations (or none), got '" +
          shorten(list) + "'");
    if (comma == std::string::npos) return;
    at = comma + 1;
  }
}
}  // namespace

Plan expand_shorthand(const PlanShorthand& s, const ModelSpec& m, const ClusterSpec& c) {
  Plan p;
  LayerStrategy l;
  l.tp = s.tp.value_or(1);
  p.pp = s.pp.value_or(1);
  l.cp = s.cp.value_or(1);
  if (l.tp < 1) throw InputError("--tp: expected >= 1");
  if (p.pp < 1) throw InputError("--pp: expected >= 1");
  if (l.cp < 1) throw InputError("--cp: expected >= 1");
  if (s.cp_kind) l.cp_kind = cp_kind_from(*s.cp_kind, "--cp-kind");
  // A kind without a split would be dropped from the plan without a word.
  if (s.cp_kind && l.cp == 1)
    throw InputError("--cp-kind: names how context parallelism moves K and V, and --cp " +
                     std::string(s.cp ? "1 turns it off" : "is not given (1: off)") +
                     "; give --cp N > 1 or leave --cp-kind out");
  const int64_t world = c.world_size();
  if (s.dp) {
    l.dp = *s.dp;
    if (l.dp < 1) throw InputError("--dp: expected >= 1");
  } else {
    const int64_t fixed = int64_t(l.tp) * l.cp * p.pp;
    if (world % fixed)
      throw InputError("--tp " + std::to_string(l.tp) +
                       (l.cp > 1 ? " x --cp " + std::to_string(l.cp) : std::string()) + " x --pp " +
                       std::to_string(p.pp) + " does not divide the " + std::to_string(world) +
                       " GPUs of --cluster/--nodes; give --dp or change --nodes");
    l.dp = int(world / fixed);
  }
  l.sequence_parallel = s.sequence_parallel;
  l.zero = s.zero.value_or(0);
  if (l.zero < 0 || l.zero > 3) throw InputError("--zero: expected 0, 1, 2 or 3");
  l.recompute = recompute_from(s.recompute.value_or("none"), "--recompute");
  if (s.offload) apply_offload(*s.offload, l);
  p.vpp = s.vpp.value_or(1);
  if (p.vpp < 1) throw InputError("--vpp: expected >= 1");
  p.microbatch_group = s.microbatch_group.value_or(0);
  std::string sched = s.schedule.value_or(p.vpp > 1 ? "interleaved" : "1f1b");
  p.schedule = schedule_from(sched, "--schedule");
  p.micro_batch = s.micro_batch.value_or(1);
  if (p.micro_batch < 1) throw InputError("--micro-batch: expected >= 1");
  const int64_t default_batch = int64_t(p.micro_batch) * l.dp;
  if (!s.global_batch && default_batch > limits::kMaxGlobalBatch)
    throw InputError(
        "--global-batch: its default --micro-batch x dp = " + std::to_string(default_batch) +
        " is above " + std::to_string(limits::kMaxGlobalBatch));
  p.global_batch = s.global_batch.value_or(int(default_batch));
  if (p.global_batch < 1) throw InputError("--global-batch: expected >= 1");
  p.dtype = dtype_from_string(s.dtype.value_or("bf16"), "--dtype");
  p.flash_attention = s.flash_attention;
  p.overlap_grad_reduce = !s.no_overlap_grad_reduce;
  p.backward_prefetch = !s.no_backward_prefetch;
  p.layers.assign(m.layers, l);
  p.embedding = l;
  p.embedding.recompute = Recompute::none;
  p.embedding.offload_activations = false;
  const int64_t nchunks = int64_t(p.pp) * (p.schedule == Schedule::interleaved ? p.vpp : 1);
  if (nchunks > m.layers)
    throw InputError("--pp " + std::to_string(p.pp) + " x --vpp " + std::to_string(p.vpp) +
                     " makes more pipeline chunks than the model's " + std::to_string(m.layers) +
                     " layers");
  p.chunks = even_chunks(m.layers, int(nchunks));
  apply_moe_shorthand(s, m, p);
  return p;
}

namespace {

// Refuses a plan: `field` of the plan read from `src` is wrong, `what` says how.
[[noreturn]] void refuse(const std::string& src, const std::string& field,
                         const std::string& what) {
  throw InputError(src + ": " + field + ": " + what);
}

// A layer's (or the embedding's, `at` naming it) strategy against the stage and the model.
void check_strategy(const LayerStrategy& l, const std::string& at, const ModelSpec& m,
                    int64_t stage_devices, int64_t stage_mb, const std::string& src) {
  auto bad = [&](const std::string& field, const std::string& what) { refuse(src, field, what); };
  if (int64_t(l.tp) * l.cp * l.dp != stage_devices)
    bad(at, "tp x cp x dp = " + std::to_string(int64_t(l.tp) * l.cp * l.dp) +
                " but the stage has " + std::to_string(stage_devices) +
                " devices (every layer must use all of its stage)");
  if (m.heads % l.tp)
    bad(at + ".tp",
        "tp " + std::to_string(l.tp) + " does not divide heads (" + std::to_string(m.heads) + ")");
  if (m.kv_heads % l.tp)
    bad(at + ".tp", "tp " + std::to_string(l.tp) + " does not divide kv_heads (" +
                        std::to_string(m.kv_heads) + ")");
  if (m.ffn_hidden % l.tp)
    bad(at + ".tp", "tp " + std::to_string(l.tp) + " does not divide ffn_hidden (" +
                        std::to_string(m.ffn_hidden) + ")");
  if (l.sequence_parallel && m.seq_len % l.tp)
    bad(at + ".sequence_parallel", "tp " + std::to_string(l.tp) + " does not divide seq_len");
  if (stage_mb % l.dp)
    bad(at + ".dp", "dp " + std::to_string(l.dp) + " does not divide the stage micro-batch of " +
                        std::to_string(stage_mb) + " samples");
}

// Neighbouring tensor-parallel degrees divide one another (the stream reshards between them).
void check_tp_neighbours(const Plan& p, const ModelSpec& m, const std::string& src) {
  auto bad = [&](const std::string& field, const std::string& what) { refuse(src, field, what); };
  for (int k = 1; k < m.layers; ++k) {
    int a = p.layers[k - 1].tp, b = p.layers[k].tp;
    if (std::max(a, b) % std::min(a, b))
      bad("layers[" + std::to_string(k) + "].tp", "consecutive tp degrees " + std::to_string(a) +
                                                      " and " + std::to_string(b) +
                                                      " must divide one another");
  }
  // The LM head takes the last layer's output in the embedding's layout (a reshard).
  const int a = p.layers.back().stream_tp(), b = p.embedding.stream_tp();
  if (std::max(a, b) % std::min(a, b))
    bad("embedding.tp", "tp " + std::to_string(b) + " and the last layer's tp " +
                            std::to_string(a) +
                            " must divide one another (the LM head takes the last layer's "
                            "output in the embedding's layout)");
}

// The interleaved schedule's groups of micro-batches, as Megatron-Core checks them
// (schedules.py, forward_backward_pipelining_with_interleaving): at least pp micro-batches, a
// group of pp to all of them, and a last group of none or at least pp.
void check_microbatch_group(const Plan& p, int64_t microbatches, const std::string& src) {
  auto bad = [&](const std::string& field, const std::string& what) { refuse(src, field, what); };
  const std::string m = std::to_string(microbatches), pp = std::to_string(p.pp);
  if (p.schedule != Schedule::interleaved) {
    if (p.microbatch_group != 0)
      bad("microbatch_group", "a group of micro-batches per chunk needs schedule 'interleaved'");
    return;
  }
  if (microbatches < p.pp)
    bad("schedule", "the interleaved schedule needs at least pp (" + pp +
                        ") micro-batches per iteration, got " + m);
  const int64_t g = p.microbatch_group;
  if (g == 0) return;
  if (g < p.pp || g > microbatches)
    bad("microbatch_group", std::to_string(g) + " micro-batches per group: expected pp (" + pp +
                                ") to the number of micro-batches (" + m + ")");
  if (const int64_t last = microbatches % g; last > 0 && last < p.pp)
    bad("microbatch_group", m + " micro-batches in groups of " + std::to_string(g) +
                                " leave a last group of " + std::to_string(last) +
                                ", fewer than pp (" + pp +
                                "): the pipeline would wait on it; choose a group that leaves none "
                                "or at least pp");
}

// The pipeline: the world it needs, its schedule, and its chunks covering the layers in order.
void check_pipeline(const Plan& p, const ModelSpec& m, const ClusterSpec& c, int64_t stage_devices,
                    const std::string& src) {
  auto bad = [&](const std::string& field, const std::string& what) { refuse(src, field, what); };
  const int64_t D = stage_devices;
  if (int64_t(p.pp) * D != c.world_size())
    bad("world size", "the plan needs pp " + std::to_string(p.pp) + " x " + std::to_string(D) +
                          " = " + std::to_string(int64_t(p.pp) * D) + " GPUs but --cluster " +
                          c.name + " with --nodes " + std::to_string(c.nodes) + " has " +
                          std::to_string(c.world_size()));
  if (p.schedule != Schedule::interleaved && p.vpp != 1)
    bad("vpp", "vpp > 1 needs schedule 'interleaved'");
  if (p.schedule == Schedule::interleaved && p.vpp < 2)
    bad("vpp", "the interleaved schedule needs vpp >= 2");
  if (p.schedule == Schedule::interleaved && p.pp < 2)
    bad("schedule", "the interleaved schedule needs pp >= 2");
  const int64_t nchunks = int64_t(p.pp) * (p.schedule == Schedule::interleaved ? p.vpp : 1);
  if ((int64_t)p.chunks.size() != nchunks)
    bad("chunks", "expected " + std::to_string(nchunks) + " layer ranges (pp x vpp), got " +
                      std::to_string(p.chunks.size()));
  int at = 0;
  for (size_t i = 0; i < p.chunks.size(); ++i) {
    if (p.chunks[i].begin != at || p.chunks[i].end <= p.chunks[i].begin)
      bad("chunks[" + std::to_string(i) + "]",
          "stage partition must cover the layers exactly once, in order, with no empty range "
          "(expected a range starting at layer " +
              std::to_string(at) + ")");
    at = p.chunks[i].end;
  }
  if (at != m.layers)
    bad("chunks", "stage partition ends at layer " + std::to_string(at) + " but the model has " +
                      std::to_string(m.layers) + " layers");
}

// Sizes of one micro-batch on one rank (the narrowest-dp layer's rank holds the most samples),
// as the cost model and runtime form them, and of one iteration's tokens: each fits in int64.
void check_sizes(const Plan& p, const ModelSpec& m, int64_t stage_mb, const std::string& src) {
  using limits::checked_product;
  const int64_t s = m.seq_len;
  int64_t min_dp = p.embedding.dp;
  for (const auto& l : p.layers) min_dp = std::min<int64_t>(min_dp, l.dp);
  const int64_t rank_mb = stage_mb / min_dp;
  checked_product(src, "logits of one micro-batch",
                  {{"samples per rank", rank_mb}, {"seq_len", s}, {"vocab", m.vocab}});
  checked_product(
      src, "attention scores of one micro-batch",
      {{"samples per rank", rank_mb}, {"seq_len", s}, {"seq_len", s}, {"heads", m.heads}});
  checked_product(src, "activations of one micro-batch",
                  {{"samples per rank", rank_mb},
                   {"seq_len", s},
                   {"34 (hidden + ffn_hidden)", 34 * (int64_t(m.hidden) + m.ffn_hidden)}});
  checked_product(src, "tokens of one iteration",
                  {{"global_batch", p.global_batch}, {"seq_len", s}});
}

}  // namespace

void validate(const Plan& p, const ModelSpec& m, const ClusterSpec& c, const std::string& src) {
  auto bad = [&](const std::string& field, const std::string& what) { refuse(src, field, what); };
  if ((int)p.layers.size() != m.layers)
    bad("layers", "has " + std::to_string(p.layers.size()) + " entries for a model with " +
                      std::to_string(m.layers) + " layers");
  // Degrees multiply in int64: tp 2^16 x dp 2^24 must be refused, not wrapped around.
  const LayerStrategy& first = p.layers.empty() ? p.embedding : p.layers.front();
  const int64_t D = int64_t(first.tp) * first.cp * first.dp;
  int64_t max_dp = p.embedding.dp;
  for (const auto& l : p.layers) max_dp = std::max<int64_t>(max_dp, l.dp);
  const int64_t stage_mb = int64_t(p.micro_batch) * max_dp;
  if (stage_mb > p.global_batch)
    bad("micro_batch", "micro-batch " + std::to_string(p.micro_batch) + " x dp " +
                           std::to_string(max_dp) + " = " + std::to_string(stage_mb) +
                           " samples is more than the global batch " +
                           std::to_string(p.global_batch));
  for (int k = 0; k < m.layers; ++k)
    check_strategy(p.layers[k], "layers[" + std::to_string(k) + "]", m, D, stage_mb, src);
  check_strategy(p.embedding, "embedding", m, D, stage_mb, src);
  validate_context_parallel(p, m, src);
  check_tp_neighbours(p, m, src);
  check_pipeline(p, m, c, D, src);
  if (p.global_batch % stage_mb)
    bad("micro_batch", "micro-batch " + std::to_string(p.micro_batch) + " x dp " +
                           std::to_string(max_dp) + " does not divide the global batch " +
                           std::to_string(p.global_batch));
  const int64_t mbs = p.global_batch / stage_mb;
  check_microbatch_group(p, mbs, src);
  check_sizes(p, m, stage_mb, src);
  validate_moe(p, m, src);
  validate_split_backward(p, m, src);
}

}  // namespace stratagem
