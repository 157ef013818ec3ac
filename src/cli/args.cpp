#include "src/cli/args.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "stratagem/error.hpp"
#include "stratagem/interop.hpp"
#include "stratagem/limits.hpp"
#include "stratagem/loaders.hpp"

namespace stratagem::cli {

const char* kModelHelp =
    "  --model NAME|FILE.json   built-in (data/models), a JSON file, or a Hugging Face "
    "config.json\n"
    "  --layers N --hidden N --heads N --kv-heads N --ffn-hidden N --vocab N --seq-len N\n"
    "                           override the model's fields (alone: a GPT-2-style decoder)\n"
    "  --experts N --top-k K --expert-ffn-hidden N --shared-experts N --dense-layers N\n"
    "                           Mixture-of-Experts: routed experts, experts per token, each\n"
    "                           expert's FFN width [--ffn-hidden], shared experts [0], leading\n"
    "                           dense layers [0]\n";
const char* kClusterHelp =
    "  --cluster NAME|FILE.json built-in (data/clusters) or a JSON file [dgx-a100-80g]\n"
    "  --nodes N                number of nodes [the cluster file's]\n"
    "  --gpus-per-node N        a job on N of each node's GPUs (shared links and host divided)\n";
const char* kFrameworkHelp =
    "  --framework NAME|FILE.json  training software [stratagem]; built in: megatron-core,\n"
    "                           megatron-lm-2021, fsdp-eager, llm.c, nanotron\n";
const char* kPlanHelp =
    "  --plan FILE              a plan JSON (as written by plan check -o or search -o), or:\n"
    "  --tp N --pp N --dp N --micro-batch N --global-batch N --vpp N --zero 0-3\n"
    "  --microbatch-group N (interleaved: micro-batches a chunk runs in a row; default pp)\n"
    "  --recompute none|selective|full --schedule gpipe|1f1b|interleaved|zb-h1|zb-h2 "
    "--sequence-parallel\n"
    "  --offload optimizer,params,activations --dtype bf16|fp16|fp32 --flash-attention\n"
    "  --no-overlap-grad-reduce --no-backward-prefetch\n"
    "  --ep N --etp N           expert (tensor) parallelism of the MoE layers [1]\n"
    "  --routing-imbalance X    busiest expert rank's load over the mean, 1 = balanced [1]\n"
    "  --capacity-factor X      cap on an expert's tokens over the mean (0: dropless) [0]\n"
    "  --moe-node-limit N       node-limited routing: each token to at most N nodes [0: none]\n"
    "  --cp N --cp-kind ring|allgather|a2a  context parallelism: the sequence split over N\n"
    "                           ranks between tp and dp [1, ring]\n";

Args::Args(std::string command, std::vector<std::string> tokens)
    : command_(std::move(command)), tokens_(std::move(tokens)) {
  // Everything after a lone "--" belongs to another program (plan import's Megatron flags):
  // kept apart so that no flag of ours matches it.
  if (auto sep = std::find(tokens_.begin(), tokens_.end(), "--"); sep != tokens_.end()) {
    passthrough_.assign(sep + 1, tokens_.end());
    tokens_.erase(sep, tokens_.end());
    has_separator_ = true;
  }
  used_.assign(tokens_.size(), false);
}

std::optional<std::string> Args::value(const std::string& flag) {
  std::optional<std::string> out;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& t = tokens_[i];
    std::string v;
    bool hit = false;
    if (t == flag) {
      if (i + 1 >= tokens_.size()) throw InputError(command_ + ": flag " + flag + " needs a value");
      used_[i] = used_[i + 1] = true;
      v = tokens_[i + 1];
      hit = true;
      ++i;
    } else if (t.rfind(flag + "=", 0) == 0) {
      used_[i] = true;
      v = t.substr(flag.size() + 1);
      hit = true;
    }
    if (hit) {
      if (out) throw InputError(command_ + ": flag " + flag + " given twice");
      out = v;
    }
  }
  return out;
}

std::optional<int> Args::int_value(const std::string& flag, int lo, int hi) {
  auto v = value(flag);
  if (!v) return std::nullopt;
  const std::string range = "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0')
    throw InputError(command_ + ": flag " + flag + ": expected an integer, got '" + shorten(*v) +
                     "'");
  if (errno == ERANGE || x < lo || x > hi)
    throw InputError(command_ + ": flag " + flag + ": expected an integer in " + range + ", got " +
                     shorten(*v));
  return static_cast<int>(x);
}

std::optional<double> Args::double_value(const std::string& flag) {
  auto v = value(flag);
  if (!v) return std::nullopt;
  char* end = nullptr;
  const double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || !std::isfinite(x))
    throw InputError(command_ + ": flag " + flag + ": expected a finite number, got '" +
                     shorten(*v) + "'");
  return x;
}

std::optional<double> Args::double_in(const std::string& flag, double lo, double hi,
                                      const std::string& what) {
  auto x = double_value(flag);
  if (x && !(*x >= lo && *x <= hi))
    throw InputError(command_ + ": flag " + flag + ": expected " + what + ", got " +
                     shorten(*value(flag)));
  return x;
}

std::string Args::required(const std::string& flag) {
  auto v = value(flag);
  if (!v) throw InputError(command_ + ": missing required flag " + flag);
  return *v;
}

bool Args::flag(const std::string& name) {
  bool hit = false;
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (tokens_[i] == name) {
      used_[i] = true;
      hit = true;
    }
  return hit;
}

std::vector<std::string> Args::positionals() {
  std::vector<std::string> out;
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (!used_[i] && (tokens_[i].empty() || tokens_[i][0] != '-')) {
      used_[i] = true;
      out.push_back(tokens_[i]);
    }
  return out;
}

void Args::finish() {
  for (size_t i = 0; i < tokens_.size(); ++i)
    if (!used_[i])
      throw InputError(command_ + ": unknown or misplaced argument '" + shorten(tokens_[i]) +
                       "' (see " + command_ + " --help)");
  if (has_separator_ && !passthrough_taken_)
    throw InputError(command_ + ": unknown or misplaced argument '--' (see " + command_ +
                     " --help)");
  check_outputs();
}

namespace {
// --experts N --top-k K --expert-ffn-hidden N --shared-experts N --dense-layers N: --experts
// makes a dense model a Mixture-of-Experts (with --top-k; experts as wide as --ffn-hidden unless
// --expert-ffn-hidden says otherwise); on an MoE model each flag overrides its field. Returns
// whether any was given. validate() checks the result (top_k <= experts, ...).
bool moe_from_args(Args& a, ModelSpec& m) {
  struct Override {
    const char* flag;
    int MoeSpec::*field;
    int lo, hi;
  };
  const Override overrides[] = {
      {"--experts", &MoeSpec::experts, 1, limits::kMaxDim},
      {"--top-k", &MoeSpec::top_k, 1, limits::kMaxDim},
      {"--expert-ffn-hidden", &MoeSpec::expert_ffn_hidden, 1, limits::kMaxDim},
      {"--shared-experts", &MoeSpec::shared_experts, 0, limits::kMaxDim},
      {"--dense-layers", &MoeSpec::dense_layers, 0, limits::kMaxLayers}};
  const bool was_moe = m.moe.enabled();
  const char* first = nullptr;
  bool top_k_given = false, width_given = false;
  for (const auto& o : overrides) {
    if (auto v = a.int_value(o.flag, o.lo, o.hi)) {
      m.moe.*(o.field) = *v;
      if (!first) first = o.flag;
      top_k_given |= o.field == &MoeSpec::top_k;
      width_given |= o.field == &MoeSpec::expert_ffn_hidden;
    }
  }
  if (!first || was_moe) return first != nullptr;
  if (!m.moe.enabled())
    throw InputError(
        a.command() + ": " + first +
        ": the model has no experts; give --experts N to make it a Mixture-of-Experts");
  if (!top_k_given)
    throw InputError(a.command() + ": --experts: give --top-k K, the experts chosen per token");
  if (!width_given) m.moe.expert_ffn_hidden = m.ffn_hidden;
  return true;
}
}  // namespace

ModelSpec model_from_args(Args& a) {
  auto name = a.value("--model");
  // The same bounds as the model file's fields (model.cpp).
  struct Override {
    const char* flag;
    int ModelSpec::*field;
    int lo, hi;
  };
  const Override overrides[] = {{"--layers", &ModelSpec::layers, 1, limits::kMaxLayers},
                                {"--hidden", &ModelSpec::hidden, 1, limits::kMaxDim},
                                {"--heads", &ModelSpec::heads, 1, limits::kMaxDim},
                                {"--kv-heads", &ModelSpec::kv_heads, 1, limits::kMaxDim},
                                {"--ffn-hidden", &ModelSpec::ffn_hidden, 1, limits::kMaxDim},
                                {"--vocab", &ModelSpec::vocab, 2, limits::kMaxDim},
                                {"--seq-len", &ModelSpec::seq_len, 1, limits::kMaxDim}};
  ModelSpec m;
  bool any = false;
  if (name) {
    a.input("--model", *name, resolve_data_file(*name, "models", "--model"));
    // A Hugging Face config.json is read with the sequence length asked for, which a sliding
    // attention window must cover.
    m = interop::load_model_or_hf(*name, a.int_value("--seq-len", 1, limits::kMaxDim));
  } else {
    // Inline flags alone describe a GPT-2-style decoder.
    m.name = "inline-gpt";
    m.layers = 12, m.hidden = 768, m.heads = 12, m.vocab = 50257, m.seq_len = 1024;
  }
  // Multi-head attention (kv_heads == heads) stays multi-head when --heads changes; GQA keeps
  // its kv_heads unless --kv-heads says otherwise.
  const bool multi_head = m.kv_heads == m.heads;
  bool kv_given = false, ffn_given = false, heads_given = false;
  for (const auto& o : overrides) {
    if (auto v = a.int_value(o.flag, o.lo, o.hi)) {
      m.*(o.field) = *v;
      any = true;
      kv_given |= o.field == &ModelSpec::kv_heads;
      ffn_given |= o.field == &ModelSpec::ffn_hidden;
      heads_given |= o.field == &ModelSpec::heads;
    }
  }
  if (!name && !any)
    throw InputError(a.command() + ": give --model NAME|FILE.json or inline shape flags");
  if (!name) {
    // Derived defaults follow the given shape unless set explicitly.
    if (!kv_given) m.kv_heads = m.heads;
    if (!ffn_given && 4LL * m.hidden > limits::kMaxDim)
      throw InputError(a.command() + ": --ffn-hidden: its default 4 x --hidden is above " +
                       std::to_string(limits::kMaxDim) + "; give --ffn-hidden");
    if (!ffn_given) m.ffn_hidden = 4 * m.hidden;
  } else if (heads_given && !kv_given && multi_head) {
    m.kv_heads = m.heads;
  }
  any |= moe_from_args(a, m);
  if (any && name) m.name += "+overrides";
  validate(m, name ? "--model " + *name + " with inline overrides" : "inline model flags");
  return m;
}

ClusterSpec cluster_from_args(Args& a, const char* default_cluster) {
  const std::string name = a.value("--cluster").value_or(default_cluster);
  a.input("--cluster", name, resolve_data_file(name, "clusters", "--cluster"));
  ClusterSpec c = load_cluster(name);
  if (auto n = a.int_value("--nodes", 1, limits::kMaxNodes)) c.nodes = *n;
  if (auto g = a.int_value("--gpus-per-node", 1, limits::kMaxNodes))
    interop::restrict_to_gpus(c, *g, "--gpus-per-node");
  return c;
}

FrameworkSpec framework_from_args(Args& a, const std::string& fallback) {
  const std::string name = a.value("--framework").value_or(fallback);
  a.input("--framework", name, resolve_data_file(name, "frameworks", "--framework"));
  return load_framework(name);
}

PlanShorthand shorthand_from_args(Args& a) {
  PlanShorthand s;
  // The same bounds as the plan file's fields (plan.cpp).
  s.tp = a.int_value("--tp", 1, limits::kMaxTp);
  s.pp = a.int_value("--pp", 1, limits::kMaxPp);
  s.dp = a.int_value("--dp", 1, limits::kMaxDp);
  s.cp = a.int_value("--cp", 1, limits::kMaxTp);
  s.cp_kind = a.value("--cp-kind");
  s.micro_batch = a.int_value("--micro-batch", 1, limits::kMaxMicroBatch);
  s.global_batch = a.int_value("--global-batch", 1, limits::kMaxGlobalBatch);
  s.vpp = a.int_value("--vpp", 1, limits::kMaxVpp);
  s.microbatch_group = a.int_value("--microbatch-group", 1, limits::kMaxGlobalBatch);
  s.zero = a.int_value("--zero", 0, 3);
  s.recompute = a.value("--recompute");
  s.schedule = a.value("--schedule");
  s.dtype = a.value("--dtype");
  s.offload = a.value("--offload");
  s.sequence_parallel = a.flag("--sequence-parallel");
  s.flash_attention = a.flag("--flash-attention");
  s.no_overlap_grad_reduce = a.flag("--no-overlap-grad-reduce");
  s.no_backward_prefetch = a.flag("--no-backward-prefetch");
  s.ep = a.int_value("--ep", 1, limits::kMaxTp);
  s.etp = a.int_value("--etp", 1, limits::kMaxTp);
  s.moe_node_limit = a.int_value("--moe-node-limit", 0, limits::kMaxNodes);
  s.routing_imbalance = a.double_in("--routing-imbalance", 1.0, 64.0, "1 (balanced) to 64");
  s.capacity_factor = a.double_in("--capacity-factor", 0.0, 64.0, "0 (dropless) or 1 to 64");
  return s;
}

Plan plan_from_args(Args& a, const ModelSpec& m, const ClusterSpec& c) {
  auto file = a.value("--plan");
  PlanShorthand s = shorthand_from_args(a);
  if (file && s.any())
    throw InputError(a.command() + ": give either --plan FILE or shorthand flags, not both");
  Plan p = file ? load_plan(*file, m) : expand_shorthand(s, m, c);
  validate(p, m, c, file ? *file : std::string("plan flags"));
  return p;
}

}  // namespace stratagem::cli
