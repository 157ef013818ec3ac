#include "src/cli/args.hpp"

#include <cstdlib>

#include "stratagem/error.hpp"

namespace stratagem::cli {

const char* kModelHelp =
    "  --model NAME|FILE.json   built-in (data/models) or a JSON file\n"
    "  --layers N --hidden N --heads N --kv-heads N --ffn-hidden N --vocab N --seq-len N\n"
    "                           override the model's fields (alone: a GPT-2-style decoder)\n";
const char* kClusterHelp =
    "  --cluster NAME|FILE.json built-in (data/clusters) or a JSON file [dgx-a100-80g]\n"
    "  --nodes N                number of nodes [the cluster file's]\n";
const char* kFrameworkHelp =
    "  --framework NAME|FILE.json  training software (data/frameworks) [stratagem]\n";
const char* kPlanHelp =
    "  --plan FILE              a plan JSON (as written by plan check -o or search -o), or:\n"
    "  --tp N --pp N --dp N --micro-batch N --global-batch N --vpp N --zero 0-3\n"
    "  --recompute none|selective|full --schedule gpipe|1f1b|interleaved --sequence-parallel\n"
    "  --offload optimizer,params,activations --dtype bf16|fp16|fp32 --flash-attention\n"
    "  --no-overlap-grad-reduce --no-backward-prefetch\n";

Args::Args(std::string command, std::vector<std::string> tokens)
    : command_(std::move(command)), tokens_(std::move(tokens)), used_(tokens_.size(), false) {}

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

std::optional<int> Args::int_value(const std::string& flag) {
  auto v = value(flag);
  if (!v) return std::nullopt;
  char* end = nullptr;
  long x = std::strtol(v->c_str(), &end, 10);
  if (v->empty() || *end != '\0' || x < -(1L << 31) || x > (1L << 31) - 1)
    throw InputError(command_ + ": flag " + flag + ": expected an integer, got '" + *v + "'");
  return static_cast<int>(x);
}

std::optional<double> Args::double_value(const std::string& flag) {
  auto v = value(flag);
  if (!v) return std::nullopt;
  char* end = nullptr;
  double x = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0')
    throw InputError(command_ + ": flag " + flag + ": expected a number, got '" + *v + "'");
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
      throw InputError(command_ + ": unknown or misplaced argument '" + tokens_[i] + "' (see " +
                       command_ + " --help)");
}

ModelSpec model_from_args(Args& a) {
  auto name = a.value("--model");
  struct Override {
    const char* flag;
    int ModelSpec::*field;
  };
  const Override overrides[] = {
      {"--layers", &ModelSpec::layers},         {"--hidden", &ModelSpec::hidden},
      {"--heads", &ModelSpec::heads},           {"--kv-heads", &ModelSpec::kv_heads},
      {"--ffn-hidden", &ModelSpec::ffn_hidden}, {"--vocab", &ModelSpec::vocab},
      {"--seq-len", &ModelSpec::seq_len}};
  ModelSpec m;
  bool any = false;
  if (name) {
    m = load_model(*name);
  } else {
    // Inline flags alone describe a GPT-2-style decoder.
    m.name = "inline-gpt";
    m.layers = 12, m.hidden = 768, m.heads = 12, m.vocab = 50257, m.seq_len = 1024;
  }
  bool kv_given = false, ffn_given = false;
  for (const auto& o : overrides) {
    if (auto v = a.int_value(o.flag)) {
      m.*(o.field) = *v;
      any = true;
      kv_given |= o.field == &ModelSpec::kv_heads;
      ffn_given |= o.field == &ModelSpec::ffn_hidden;
    }
  }
  if (!name && !any)
    throw InputError(a.command() + ": give --model NAME|FILE.json or inline shape flags");
  if (!name) {
    // Derived defaults follow the given shape unless set explicitly.
    if (!kv_given) m.kv_heads = m.heads;
    if (!ffn_given) m.ffn_hidden = 4 * m.hidden;
  }
  if (any && name) m.name += "+overrides";
  validate(m, name ? "--model " + *name + " with inline overrides" : "inline model flags");
  return m;
}

ClusterSpec cluster_from_args(Args& a, const char* default_cluster) {
  ClusterSpec c = load_cluster(a.value("--cluster").value_or(default_cluster));
  if (auto n = a.int_value("--nodes")) {
    if (*n < 1)
      throw InputError(a.command() + ": --nodes: expected >= 1, got " + std::to_string(*n));
    c.nodes = *n;
  }
  return c;
}

FrameworkSpec framework_from_args(Args& a) {
  return load_framework(a.value("--framework").value_or("stratagem"));
}

PlanShorthand shorthand_from_args(Args& a) {
  PlanShorthand s;
  s.tp = a.int_value("--tp");
  s.pp = a.int_value("--pp");
  s.dp = a.int_value("--dp");
  s.micro_batch = a.int_value("--micro-batch");
  s.global_batch = a.int_value("--global-batch");
  s.vpp = a.int_value("--vpp");
  s.zero = a.int_value("--zero");
  s.recompute = a.value("--recompute");
  s.schedule = a.value("--schedule");
  s.dtype = a.value("--dtype");
  s.offload = a.value("--offload");
  s.sequence_parallel = a.flag("--sequence-parallel");
  s.flash_attention = a.flag("--flash-attention");
  s.no_overlap_grad_reduce = a.flag("--no-overlap-grad-reduce");
  s.no_backward_prefetch = a.flag("--no-backward-prefetch");
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
