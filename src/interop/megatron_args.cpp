// A Megatron-LM pretrain_gpt.py command line -> ModelSpec + Plan. Flag names, defaults and
// semantics are those of megatron/training/arguments.py (test/data/frameworks/megatron-lm.txt
// cites the version read); flags that shape neither the model nor the plan are listed, not read.
#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include "stratagem/error.hpp"
#include "stratagem/interop.hpp"
#include "stratagem/limits.hpp"
#include "stratagem/schedule.hpp"

namespace stratagem::interop {
namespace {

// Flags read here, by whether they take a value.
const std::set<std::string> kValued = {"--num-layers",
                                       "--hidden-size",
                                       "--ffn-hidden-size",
                                       "--num-attention-heads",
                                       "--num-query-groups",
                                       "--kv-channels",
                                       "--seq-length",
                                       "--max-position-embeddings",
                                       "--vocab-size",
                                       "--tokenizer-type",
                                       "--make-vocab-size-divisible-by",
                                       "--normalization",
                                       "--position-embedding-type",
                                       "--attention-dropout",
                                       "--attention-backend",
                                       "--hidden-dropout",
                                       "--tensor-model-parallel-size",
                                       "--pipeline-model-parallel-size",
                                       "--num-layers-per-virtual-pipeline-stage",
                                       "--num-virtual-stages-per-pipeline-rank",
                                       "--microbatch-group-size-per-virtual-pipeline-stage",
                                       "--context-parallel-size",
                                       "--cp-comm-type",
                                       "--expert-model-parallel-size",
                                       "--num-experts",
                                       "--micro-batch-size",
                                       "--global-batch-size",
                                       "--recompute-granularity",
                                       "--recompute-method",
                                       "--recompute-num-layers",
                                       "--decoder-first-pipeline-num-layers",
                                       "--decoder-last-pipeline-num-layers",
                                       "--pipeline-model-parallel-layout",
                                       "--rotary-base",
                                       "--rotary-percent",
                                       "--rope-scaling-factor",
                                       "--activations-checkpoint-method",
                                       "--activations-checkpoint-num-layers"};
const std::set<std::string> kSwitches = {"--group-query-attention",
                                         "--swiglu",
                                         "--squared-relu",
                                         "--untie-embeddings-and-output-weights",
                                         "--disable-bias-linear",
                                         "--add-qkv-bias",
                                         "--use-rotary-position-embeddings",
                                         "--sequence-parallel",
                                         "--use-distributed-optimizer",
                                         "--overlap-grad-reduce",
                                         "--bf16",
                                         "--fp16",
                                         "--use-flash-attn",
                                         "--recompute-activations",
                                         "--checkpoint-activations",
                                         "--use-rope-scaling"};
// Flags that change what a job costs in ways stratagem does not model: refused, never skipped
// (a forecast without them would be for another job). Megatron-LM's dest for --fp8-format is
// args.fp8, for --fp4-format args.fp4; each turns the low-precision GEMMs on.
const std::map<std::string, std::string> kNotModelled = {
    {"--fp8-format", "FP8 training is not modelled yet (stratagem prices bf16, fp16 and fp32)"},
    {"--fp4-format", "FP4 training is not modelled yet (stratagem prices bf16, fp16 and fp32)"}};

struct Flags {
  std::string source;
  std::map<std::string, std::string> values;
  std::set<std::string> switches;
  std::vector<std::string> ignored;

  bool has(const std::string& f) const { return values.count(f) || switches.count(f); }
  bool on(const std::string& f) const { return switches.count(f) > 0; }
  std::optional<std::string> text(const std::string& f) const {
    auto it = values.find(f);
    return it == values.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  [[noreturn]] void fail(const std::string& f, const std::string& what) const {
    throw InputError(source + ": flag " + f + ": " + what);
  }
  std::optional<int> integer(const std::string& f, int lo, int hi) const {
    auto v = text(f);
    if (!v) return std::nullopt;
    size_t used = 0;
    long long x = 0;
    try {
      x = std::stoll(*v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != v->size() || x < lo || x > hi)
      fail(f, "expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                  "], got '" + shorten(*v) + "'");
    return int(x);
  }
  int required(const std::string& f, int lo, int hi) const {
    if (auto x = integer(f, lo, hi)) return *x;
    fail(f, "missing (Megatron-LM requires it)");
  }
  double number(const std::string& f, double fallback) const {
    auto v = text(f);
    if (!v) return fallback;
    try {
      size_t used = 0;
      const double x = std::stod(*v, &used);
      if (used == v->size()) return x;
    } catch (const std::exception&) {
    }
    fail(f, "expected a number, got '" + shorten(*v) + "'");
  }
  // A probability: stod reads "nan", "inf" and "-1", none of which Megatron-LM could train with.
  double probability(const std::string& f, double fallback) const {
    const double x = number(f, fallback);
    if (!(x >= 0.0 && x <= 1.0))
      fail(f, "expected a probability in [0, 1], got '" + shorten(*text(f)) + "'");
    return x;
  }
  std::string choice(const std::string& f, std::initializer_list<const char*> choices,
                     const std::string& fallback) const {
    auto v = text(f);
    if (!v) return fallback;
    std::string list;
    for (const char* c : choices) {
      if (*v == c) return *v;
      list += std::string(list.empty() ? "" : "|") + c;
    }
    fail(f, "expected " + list + ", got '" + shorten(*v) + "'");
  }
};

bool is_flag(const std::string& t) {
  return t.size() > 2 && t.compare(0, 2, "--") == 0;
}

Flags parse_flags(const std::vector<std::string>& args, size_t from, const std::string& source) {
  Flags f;
  f.source = source;
  for (size_t i = from; i < args.size(); ++i) {
    std::string name = args[i];
    if (!is_flag(name))
      throw InputError(source + ": unexpected argument '" + shorten(name) + "' (expected a flag)");
    std::optional<std::string> inline_value;
    if (auto eq = name.find('='); eq != std::string::npos)
      inline_value = name.substr(eq + 1), name = name.substr(0, eq);
    // As argparse: a switch given again stays on, and an option given again takes its last
    // value (a launch script's defaults followed by the user's own).
    if (auto refused = kNotModelled.find(name); refused != kNotModelled.end())
      f.fail(name, refused->second);
    if (kSwitches.count(name)) {
      if (inline_value) f.fail(name, "is a switch and takes no value");
      f.switches.insert(name);
    } else if (kValued.count(name)) {
      if (!inline_value && (i + 1 >= args.size() || is_flag(args[i + 1])))
        f.fail(name, "needs a value");
      f.values[name] = inline_value ? *inline_value : args[++i];
    } else {
      // Not about the model or the plan: skip its values (some flags take several).
      if (std::find(f.ignored.begin(), f.ignored.end(), name) == f.ignored.end())
        f.ignored.push_back(name);
      while (!inline_value && i + 1 < args.size() && !is_flag(args[i + 1])) ++i;
    }
  }
  return f;
}

constexpr int kBig = limits::kMaxDim;

// GPT2BPETokenizer's vocabulary (gpt2-vocab.json: 50,257 tokens), the one tokenizer whose size
// is known without its files.
constexpr int kGpt2BpeVocab = 50257;

// The model's vocabulary. --vocab-size is taken as written (the export writes the model's own
// vocabulary there, so that a round trip is exact). Without it, the tokenizer's: pretrain_gpt.py
// defaults --tokenizer-type to GPT2BPETokenizer (its args_defaults), whose 50,257 tokens Megatron
// pads to a multiple of --make-vocab-size-divisible-by (default 128) x tp (vocab_utils.py), as
// the model it builds holds them. Other tokenizers' sizes are in their files.
int vocabulary(const Flags& f, std::vector<std::string>& notes) {
  if (auto v = f.integer("--vocab-size", 2, kBig)) {
    notes.push_back("vocabulary " + std::to_string(*v) +
                    " unpadded (Megatron pads it to --make-vocab-size-divisible-by x tp)");
    return *v;
  }
  const std::string tokenizer = f.text("--tokenizer-type").value_or("GPT2BPETokenizer");
  if (tokenizer != "GPT2BPETokenizer")
    f.fail("--vocab-size",
           "missing: the vocabulary of --tokenizer-type " + shorten(tokenizer) +
               " is in its files, which stratagem does not read; give --vocab-size (after -- "
               "with --args-file)");
  const int64_t multiple =
      int64_t(f.integer("--make-vocab-size-divisible-by", 1, kBig).value_or(128)) *
      f.integer("--tensor-model-parallel-size", 1, limits::kMaxTp).value_or(1);
  const int64_t padded = (kGpt2BpeVocab + multiple - 1) / multiple * multiple;
  if (padded > kBig)
    f.fail("--make-vocab-size-divisible-by", "pads the vocabulary past " + std::to_string(kBig));
  notes.push_back("vocabulary " + std::to_string(kGpt2BpeVocab) + " (GPT2BPETokenizer" +
                  (f.has("--tokenizer-type") ? "" : ", pretrain_gpt.py's default") +
                  ") padded to " + std::to_string(padded) + " as Megatron pads it (a multiple of " +
                  std::to_string(multiple) + ")");
  return int(padded);
}

ModelSpec model_from_flags(const Flags& f, std::vector<std::string>& notes) {
  if (f.has("--num-experts") ||
      f.integer("--expert-model-parallel-size", 1, 1 << 16).value_or(1) > 1)
    f.fail(f.has("--num-experts") ? "--num-experts" : "--expert-model-parallel-size",
           "Mixture-of-Experts is not supported yet (issue #26)");
  if (f.on("--squared-relu")) f.fail("--squared-relu", "the squared-ReLU MLP is not modelled");
  ModelSpec m;
  m.name = "megatron-job";
  m.arch = Arch::decoder;
  m.layers = f.required("--num-layers", 1, limits::kMaxLayers);
  m.hidden = f.required("--hidden-size", 1, kBig);
  m.heads = f.required("--num-attention-heads", 1, kBig);
  // Megatron's --num-query-groups defaults to 1 and counts only under --group-query-attention.
  m.kv_heads = f.on("--group-query-attention")
                   ? f.integer("--num-query-groups", 1, kBig).value_or(1)
                   : m.heads;
  if (auto kv = f.integer("--kv-channels", 1, kBig); kv && int64_t(*kv) * m.heads != m.hidden)
    f.fail("--kv-channels",
           "a head width other than hidden-size / num-attention-heads is not "
           "modelled");
  m.activation = f.on("--swiglu") ? Activation::swiglu : Activation::gelu;
  // Megatron's default FFN width (validate_args): 4h, or for SwiGLU 8h/3 rounded down to 64.
  const int ffn_default = f.on("--swiglu") ? int((4LL * m.hidden * 2 / 3) / 64 * 64)
                                           : int(std::min<int64_t>(4LL * m.hidden, kBig));
  m.ffn_hidden = f.integer("--ffn-hidden-size", 1, kBig).value_or(ffn_default);
  m.seq_len = f.required("--seq-length", 1, kBig);
  m.vocab = vocabulary(f, notes);
  m.norm = f.choice("--normalization", {"LayerNorm", "RMSNorm"}, "LayerNorm") == "RMSNorm"
               ? Norm::rmsnorm
               : Norm::layernorm;
  const std::string pos =
      f.choice("--position-embedding-type", {"learned_absolute", "rope"}, "learned_absolute");
  m.position = pos == "rope" || f.on("--use-rotary-position-embeddings") ? Position::rope
                                                                         : Position::learned;
  m.tied_embeddings = !f.on("--untie-embeddings-and-output-weights");
  m.bias = !f.on("--disable-bias-linear");
  // Carried for the exports; not counted (a few thousand parameters per layer).
  m.qkv_bias = !m.bias && f.on("--add-qkv-bias");
  if (m.qkv_bias) notes.push_back("--add-qkv-bias: the QKV biases are exported but not counted");
  if (m.position == Position::rope) {
    m.rope.base = f.integer("--rotary-base", 1, INT32_MAX).value_or(10000);
    m.rope.percent = f.number("--rotary-percent", 1.0);
    if (!(m.rope.percent > 0 && m.rope.percent <= 1))
      f.fail("--rotary-percent",
             "expected a share in (0, 1], got '" + shorten(*f.text("--rotary-percent")) + "'");
    if (f.on("--use-rope-scaling")) {
      m.rope.llama3_factor = f.number("--rope-scaling-factor", 8.0);
      if (!(m.rope.llama3_factor > 0 && m.rope.llama3_factor <= 1e6))
        f.fail("--rope-scaling-factor", "expected a factor in (0, 1e6]");
    }
  }
  // Both read before either is used: each must be checked.
  const double attention_dropout = f.probability("--attention-dropout", 0.1);
  const double hidden_dropout = f.probability("--hidden-dropout", 0.1);
  m.dropout = attention_dropout > 0 || hidden_dropout > 0;
  validate(m, f.source);
  return m;
}

// Megatron-LM before v3.0 had no recompute granularity: --activations-checkpoint-method
// uniform|block (with --activations-checkpoint-num-layers, default 1) recomputed whole layers, and
// --checkpoint-activations meant the uniform method. Megatron-LM now names them
// --recompute-granularity full, --recompute-method and --recompute-num-layers and refuses the old
// names, but old launch scripts still carry them: they are read as the new ones, so that
// apply_recompute holds the one rule.
void read_old_recompute_names(Flags& f, std::vector<std::string>& notes) {
  const char* old = f.has("--activations-checkpoint-method") ? "--activations-checkpoint-method"
                    : f.on("--checkpoint-activations")       ? "--checkpoint-activations"
                    : f.has("--activations-checkpoint-num-layers")
                        ? "--activations-checkpoint-num-layers"
                        : nullptr;
  if (!old) return;
  for (const char* now : {"--recompute-granularity", "--recompute-method", "--recompute-num-layers",
                          "--recompute-activations"})
    if (f.has(now))
      f.fail(old, std::string("given with ") + now +
                      " (the pre-v3.0 name and the current one); give one of them");
  if (!f.has("--activations-checkpoint-method") && !f.on("--checkpoint-activations"))
    f.fail(old, "needs --activations-checkpoint-method (it counts the layers it recomputes)");
  const std::string method = f.choice("--activations-checkpoint-method", {"uniform", "block"},
                                      "uniform");  // --checkpoint-activations: uniform
  f.values["--recompute-granularity"] = "full";
  f.values["--recompute-method"] = method;
  if (auto n = f.text("--activations-checkpoint-num-layers"))
    f.values["--recompute-num-layers"] = *n;
  notes.push_back(std::string(old) +
                  " (Megatron-LM before v3.0) read as --recompute-granularity "
                  "full --recompute-method " +
                  method);
}

// --pipeline-model-parallel-layout, as Megatron-Core's PipelineParallelLayerLayout reads it: one
// string per model chunk split by '|', in chunk order (chunk c on pipeline rank c % pp, as the
// Plan's chunks); 't' a decoder layer, 'E' the embedding (first), 'L' the loss (last), 'm' an
// MTP layer; "(...)*n" and "x*n" repeat, commas are cosmetic. The decoder layers of each chunk.
std::vector<int> layout_chunks(const Flags& f, int layers, int pp) {
  const std::string flag = "--pipeline-model-parallel-layout";
  std::string text = *f.text(flag);
  text.erase(std::remove(text.begin(), text.end(), ','), text.end());
  // Its two re.sub passes: every "(...)*n" unrolled, then every "x*n".
  const std::regex passes[] = {std::regex(R"(\(([^)]+)\)\*(\d+))"), std::regex(R"((.)\*(\d+))")};
  for (const std::regex& re : passes) {
    std::string out;
    auto at = text.cbegin();
    for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
      const auto& m = *it;
      out.append(at, m[0].first);
      const std::string unit = m[1].str();
      const long long times = m[2].length() > 6 ? kBig : std::stoll(m[2].str());
      if (times * double(unit.size()) + double(out.size()) > 16.0 * limits::kMaxLayers)
        f.fail(flag,
               "unrolls to more than " + std::to_string(16 * limits::kMaxLayers) + " characters");
      for (long long k = 0; k < times; ++k) out += unit;
      at = m[0].second;
    }
    out.append(at, text.cend());
    text = out;
  }
  std::vector<int> chunks(1, 0);
  int embeddings = 0, losses = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '|')
      chunks.push_back(0);
    else if (c == 't')
      ++chunks.back();
    else if (c == 'E' && i == 0)
      ++embeddings;
    else if (c == 'L' && i + 1 == text.size())
      ++losses;
    else if (c == 'm')
      f.fail(flag, "multi-token-prediction layers ('m') are not modelled yet");
    else if (c == 'E' || c == 'L')
      f.fail(flag, std::string("'") + c + "' must be the layout's " +
                       (c == 'E' ? "first" : "last") + " layer, once");
    else
      f.fail(flag, "unknown layer '" + shorten(std::string(1, c)) +
                       "' (expected E, t, m or L after unrolling)");
  }
  if (embeddings != 1 || losses != 1)
    f.fail(flag, "must begin with the embedding 'E' and end with the loss 'L'");
  if (chunks.size() % size_t(pp))
    f.fail(flag, std::to_string(chunks.size()) + " stages are not a multiple of pp " +
                     std::to_string(pp));
  int total = 0;
  for (int n : chunks) {
    if (n == 0) f.fail(flag, "a stage without decoder layers is not modelled");
    total += n;
  }
  if (total != layers)
    f.fail(flag, "holds " + std::to_string(total) + " decoder layers ('t'), not --num-layers " +
                     std::to_string(layers));
  for (const char* other :
       {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
        "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"})
    if (f.has(other)) f.fail(flag, std::string("given with ") + other + "; give one of them");
  return chunks;
}

// Megatron's stage split: the layout's, or the first and last stage may hold their own layer
// counts; the other stages share the rest evenly (it must divide).
std::vector<LayerRange> stage_split(const Flags& f, int layers, int pp, int vpp) {
  if (f.has("--pipeline-model-parallel-layout")) {
    std::vector<LayerRange> out;
    for (int n : layout_chunks(f, layers, pp)) {
      const int at = out.empty() ? 0 : out.back().end;
      out.push_back({at, at + n});
    }
    return out;
  }
  const auto first = f.integer("--decoder-first-pipeline-num-layers", 1, layers);
  const auto last = f.integer("--decoder-last-pipeline-num-layers", 1, layers);
  if (!first && !last) {
    if (layers % (pp * vpp))
      f.fail("--num-layers", std::to_string(layers) + " layers do not split evenly over " +
                                 std::to_string(pp * vpp) + " pipeline chunks (pp x vpp)");
    return even_chunks(layers, pp * vpp);
  }
  if (vpp > 1)
    f.fail(first ? "--decoder-first-pipeline-num-layers" : "--decoder-last-pipeline-num-layers",
           "uneven first/last stages with virtual pipeline stages are not read yet");
  if (pp < 2) f.fail("--decoder-first-pipeline-num-layers", "needs pipeline parallelism");
  const int middle_stages = pp - (first ? 1 : 0) - (last ? 1 : 0);
  const int rest = layers - first.value_or(0) - last.value_or(0);
  if (rest < middle_stages || (middle_stages == 0 ? rest != 0 : rest % middle_stages))
    f.fail(first ? "--decoder-first-pipeline-num-layers" : "--decoder-last-pipeline-num-layers",
           "the other " + std::to_string(middle_stages) + " stages cannot share the remaining " +
               std::to_string(rest) + " layers evenly");
  std::vector<LayerRange> out;
  int at = 0;
  for (int s = 0; s < pp; ++s) {
    int n = middle_stages ? rest / middle_stages : 0;
    if (s == 0 && first) n = *first;
    if (s == pp - 1 && last) n = *last;
    out.push_back({at, at + n});
    at += n;
  }
  return out;
}

// --recompute-granularity full --recompute-method block --recompute-num-layers N: the first N
// layers of every model chunk are recomputed, the others keep their activations.
void apply_recompute(const Flags& f, Plan& p, std::vector<std::string>& notes) {
  const std::string granularity =
      f.on("--recompute-activations")
          ? "selective"
          : f.choice("--recompute-granularity", {"full", "selective"}, "none");
  if (granularity != "full") return;
  const std::string method = f.choice("--recompute-method", {"uniform", "block"}, "");
  if (method.empty())
    f.fail("--recompute-method", "missing: full recompute needs uniform or block");
  const int n = f.integer("--recompute-num-layers", 1, limits::kMaxLayers).value_or(1);
  if (method == "uniform") {
    if (n > 1)
      notes.push_back(
          "--recompute-method uniform --recompute-num-layers " + std::to_string(n) +
          " read as full recompute of every layer (one saved input per layer, not per " +
          std::to_string(n) + ")");
    return;
  }
  for (const auto& chunk : p.chunks)
    for (int k = chunk.begin; k < chunk.end; ++k)
      p.layers[k].recompute = k - chunk.begin < n ? Recompute::full : Recompute::none;
}

// A launcher flag (torchrun or python -m torch.distributed.run, before the script) as written:
// read only where it sets the job's size, so that a value the user's own flag replaces (a
// script's $NUM_NODES) is not parsed.
struct LauncherValue {
  std::string flag, text;
};
struct Launcher {
  std::optional<LauncherValue> nodes, gpus_per_node;
};

Launcher read_launcher(const std::vector<std::string>& args, size_t script) {
  Launcher l;
  for (size_t i = 0; i < script; ++i) {
    std::string name = args[i], value;
    if (auto eq = name.find('='); eq != std::string::npos)
      value = name.substr(eq + 1), name = name.substr(0, eq);
    std::optional<LauncherValue>* slot = name == "--nnodes" ? &l.nodes
                                         : name == "--nproc-per-node" || name == "--nproc_per_node"
                                             ? &l.gpus_per_node
                                             : nullptr;
    if (!slot) continue;
    if (value.empty() && i + 1 < script) value = args[++i];
    *slot = LauncherValue{name, value};  // given again: the last, as torchrun's argparse
  }
  return l;
}

int launcher_count(const LauncherValue& v, const std::string& source) {
  Flags f;
  f.source = source;
  f.values[v.flag] = v.text;
  return f.required(v.flag, 1, limits::kMaxNodes);
}

// The job's size: the user's --nodes / --gpus-per-node win over the launcher's --nnodes /
// --nproc-per-node (an example script is written for one size, and the user asks about the
// job at theirs); a launcher value the user did not replace sets the size; a replaced one that
// differs is said in a note.
void apply_job_size(const Launcher& launcher, const JobSize& user, ClusterSpec& cluster,
                    const std::string& source, std::vector<std::string>& notes) {
  const auto overridden = [&](const LauncherValue& v, const char* user_flag, int user_value) {
    if (v.text != std::to_string(user_value))
      notes.push_back(std::string(user_flag) + " " + std::to_string(user_value) +
                      " (command line) used instead of the file's " + v.flag + " " +
                      shorten(v.text));
  };
  if (launcher.gpus_per_node) {
    if (user.gpus_per_node)
      overridden(*launcher.gpus_per_node, "--gpus-per-node", *user.gpus_per_node);
    else if (const int g = launcher_count(*launcher.gpus_per_node, source);
             g != cluster.node.gpus_per_node)
      restrict_to_gpus(cluster, g, source + ": " + launcher.gpus_per_node->flag);
  }
  if (launcher.nodes) {
    if (user.nodes)
      overridden(*launcher.nodes, "--nodes", *user.nodes);
    else
      cluster.nodes = launcher_count(*launcher.nodes, source);
  }
}

}  // namespace

MegatronJob megatron_job_from_args(const std::vector<std::string>& args, ClusterSpec& cluster,
                                   const std::string& source, const JobSize& user_size) {
  size_t script = 0;
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].size() > 3 && args[i].compare(args[i].size() - 3, 3, ".py") == 0) {
      script = i + 1;
      break;
    }
  const Launcher launcher = read_launcher(args, script ? script - 1 : 0);
  Flags f = parse_flags(args, script, source);
  MegatronJob job;
  read_old_recompute_names(f, job.notes);
  job.ignored_flags = f.ignored;
  job.model = model_from_flags(f, job.notes);
  apply_job_size(launcher, user_size, cluster, source, job.notes);

  PlanShorthand s;
  const int tp = f.integer("--tensor-model-parallel-size", 1, limits::kMaxTp).value_or(1);
  const int pp = f.integer("--pipeline-model-parallel-size", 1, limits::kMaxPp).value_or(1);
  const int cp = f.integer("--context-parallel-size", 1, limits::kMaxTp).value_or(1);
  // Megatron-Core's --cp-comm-type (default p2p, its ring); a2a+p2p (hierarchical) is not one
  // of the modelled kinds.
  const std::string comm =
      f.choice("--cp-comm-type", {"p2p", "all_gather", "a2a", "a2a+p2p"}, "p2p");
  if (comm == "a2a+p2p")
    f.fail("--cp-comm-type", "a2a+p2p (hierarchical context parallelism) is not modelled");
  if (cp > 1) {
    s.cp = cp;
    s.cp_kind = comm == "p2p" ? "ring" : comm == "all_gather" ? "allgather" : "a2a";
  }
  const int64_t world = cluster.world_size();
  if (world % (int64_t(tp) * pp * cp))
    f.fail("--tensor-model-parallel-size",
           "tp " + std::to_string(tp) + (cp > 1 ? " x cp " + std::to_string(cp) : "") + " x pp " +
               std::to_string(pp) + " does not divide the " + std::to_string(world) +
               " GPUs of the job");
  const int dp = int(world / (int64_t(tp) * pp * cp));
  int vpp = f.integer("--num-virtual-stages-per-pipeline-rank", 1, limits::kMaxVpp).value_or(1);
  if (auto per = f.integer("--num-layers-per-virtual-pipeline-stage", 1, limits::kMaxLayers)) {
    if (job.model.layers % pp || (job.model.layers / pp) % *per)
      f.fail("--num-layers-per-virtual-pipeline-stage",
             std::to_string(*per) + " does not divide the " + std::to_string(job.model.layers) +
                 " layers per pipeline stage evenly");
    vpp = job.model.layers / pp / *per;
  }
  if (f.has("--pipeline-model-parallel-layout"))
    vpp = int(layout_chunks(f, job.model.layers, pp).size()) / pp;
  s.tp = tp, s.pp = pp, s.dp = dp, s.vpp = vpp;
  s.micro_batch = f.required("--micro-batch-size", 1, limits::kMaxMicroBatch);
  s.global_batch = f.integer("--global-batch-size", 1, limits::kMaxGlobalBatch)
                       .value_or(int(std::min<int64_t>(int64_t(*s.micro_batch) * dp, INT32_MAX)));
  s.schedule = vpp > 1 ? "interleaved" : "1f1b";
  // Megatron-Core's group of micro-batches per virtual stage, pp unless given: where the
  // micro-batches are not a multiple of pp it then refuses the job, and so does validate().
  // (A group equal to the one the plan would choose itself, interleaved_group's, stays unset.)
  const int64_t microbatches = *s.global_batch / (int64_t(*s.micro_batch) * dp);
  if (auto g = f.integer("--microbatch-group-size-per-virtual-pipeline-stage", 1,
                         limits::kMaxGlobalBatch)) {
    if (microbatches < pp || *g != interleaved_group(pp, int(microbatches)))
      s.microbatch_group = *g;
  } else if (vpp > 1 && microbatches % pp) {
    s.microbatch_group = pp;
  }
  s.zero = f.on("--use-distributed-optimizer") ? 1 : 0;
  const std::string granularity =
      f.on("--recompute-activations")
          ? "selective"
          : f.choice("--recompute-granularity", {"full", "selective"}, "none");
  s.recompute = granularity;
  // Megatron-LM asserts that at most one is set (validate_args): neither may win silently here.
  if (f.on("--bf16") && f.on("--fp16")) f.fail("--fp16", "given with --bf16; give one of them");
  s.dtype = f.on("--bf16") ? "bf16" : f.on("--fp16") ? "fp16" : "fp32";
  // Megatron turns sequence parallelism off at tp 1 (validate_args).
  s.sequence_parallel = f.on("--sequence-parallel") && tp > 1;
  // Megatron-Core's --attention-backend (AttnBackend: flash, fused, unfused, local, auto): flash
  // and fused (cuDNN) are fused-kernel attention that keeps no score matrix, and auto picks one of
  // them through Transformer Engine; unfused and local materialise the scores. Absent, the
  // older switch --use-flash-attn says it (a job exported by stratagem writes that switch).
  const std::string backend =
      f.choice("--attention-backend", {"flash", "fused", "unfused", "local", "auto"}, "");
  s.flash_attention =
      backend.empty() ? f.on("--use-flash-attn") : backend != "unfused" && backend != "local";
  s.no_overlap_grad_reduce = !f.on("--overlap-grad-reduce");
  try {
    job.plan = expand_shorthand(s, job.model, cluster);
  } catch (const InputError& e) {
    throw InputError(source + ": " + e.what());
  }
  job.plan.chunks = stage_split(f, job.model.layers, pp, vpp);
  apply_recompute(f, job.plan, job.notes);
  validate(job.plan, job.model, cluster, source);
  return job;
}

}  // namespace stratagem::interop
