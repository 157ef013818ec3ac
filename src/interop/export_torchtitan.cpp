// Plan -> torchtitan job config (TOML; keys checked against test/data/frameworks/torchtitan.txt).
#include <cstdio>
#include <sstream>

#include "src/interop/plan_shape.hpp"
#include "stratagem/error.hpp"
#include "stratagem/interop.hpp"

namespace stratagem::interop {

namespace {

// A TOML basic string: quotes and backslashes escaped, and control characters as \uXXXX, so
// that no name ends the string or the line.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += std::string("\\") + ch;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04X", unsigned(c));
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// A comment's text on one line (control characters shown as '?').
std::string comment_text(const std::string& s) {
  return shorten(s, s.size());
}

// torchtitan's llama3 flavors (torchtitan/models/llama3/flavors.py, MODEL_FLAVORS, read at
// commit 10503c1c3c113e0715f203b11a505e0b817289c3): each FFN width is its
// compute_ffn_hidden_dim(dim, multiple_of, ffn_dim_multiplier); all have vocabulary 128256,
// RMSNorm, SwiGLU, RoPE and no biases, and only 1B and 3B tie the embeddings.
struct Flavor {
  const char* name;
  int layers, hidden, heads, kv_heads, ffn_hidden;
  bool tied;
};
constexpr Flavor kLlama3Flavors[] = {{"1B", 16, 2048, 32, 8, 8192, true},
                                     {"3B", 28, 3072, 24, 8, 8192, true},
                                     {"8B", 32, 4096, 32, 8, 14336, false},
                                     {"70B", 80, 8192, 64, 8, 28672, false},
                                     {"405B", 126, 16384, 128, 8, 53248, false}};

// The flavor torchtitan builds this model as, if it has one: the job then runs as written.
const char* llama3_flavor(const ModelSpec& m) {
  for (const Flavor& f : kLlama3Flavors)
    if (m.layers == f.layers && m.hidden == f.hidden && m.heads == f.heads &&
        m.kv_heads == f.kv_heads && m.ffn_hidden == f.ffn_hidden && m.vocab == 128256 &&
        m.tied_embeddings == f.tied && !m.bias && !m.moe.enabled() &&
        m.attention == AttentionKind::mha)
      return f.name;
  return nullptr;
}

const char* schedule_name(Schedule s) {
  return s == Schedule::gpipe ? "GPipe" : s == Schedule::one_f_one_b ? "1F1B" : "Interleaved1F1B";
}

// torchtitan's Llama modules by fully qualified name: tok_embeddings, layers.<i>, norm, output.
std::string model_parts(const Plan& p) {
  std::string out = "[";
  for (size_t c = 0; c < p.chunks.size(); ++c) {
    out += c ? ", [" : "[";
    bool first = true;
    auto add = [&](const std::string& fqn) {
      out += (first ? "" : ", ") + quoted(fqn);
      first = false;
    };
    if (c == 0) add("tok_embeddings");
    for (int k = p.chunks[c].begin; k < p.chunks[c].end; ++k) add("layers." + std::to_string(k));
    if (c + 1 == p.chunks.size()) add("norm"), add("output");
    out += "]";
  }
  return out + "]";
}

}  // namespace

std::string export_torchtitan(const Plan& p, const ModelSpec& m, const ClusterSpec& c) {
  const LayerStrategy& l = p.layers.front();
  const bool llama =
      m.norm == Norm::rmsnorm && m.activation == Activation::swiglu && m.position == Position::rope;
  std::ostringstream os;
  os << "# torchtitan job config, written by stratagem export for " << comment_text(m.name)
     << " on " << comment_text(c.name) << "\n# plan: " << p.describe() << "\n# launch on "
     << c.nodes << " node(s) x " << c.node.gpus_per_node << " GPUs (NGPU=" << c.node.gpus_per_node
     << ")\n";
  os << "\n[job]\ndescription = " << quoted("stratagem plan for " + m.name) << "\n";
  os << "\n# the model: " << m.layers << " layers, hidden " << m.hidden << ", " << m.heads
     << " heads (" << m.kv_heads << " kv), ffn " << m.ffn_hidden << ", vocab " << m.vocab << "; ";
  const char* flavor = llama ? llama3_flavor(m) : nullptr;
  if (flavor)
    os << "torchtitan's llama3 flavor " << flavor;
  else
    os << "register a flavor of that shape under this name";
  if (!llama) os << " (torchtitan's built-in models are Llama-style; this one is not)";
  os << "\n[model]\nname = " << quoted(llama ? "llama3" : m.name)
     << "\nflavor = " << quoted(flavor ? flavor : m.name) << "\n";
  os << "\n[training]\nlocal_batch_size = " << detail::local_batch(p)
     << "\nglobal_batch_size = " << p.global_batch << "\nseq_len = " << m.seq_len
     << "\nmixed_precision_param = " << quoted(p.dtype == Dtype::bf16 ? "bfloat16" : "float32")
     << "\nenable_cpu_offload = " << (l.offload_params ? "true" : "false") << "\n";
  os << "\n[parallelism]\ndata_parallel_replicate_degree = " << (l.zero == 3 ? 1 : l.dp)
     << "\ndata_parallel_shard_degree = " << (l.zero == 3 ? l.dp : 1)
     << "\ntensor_parallel_degree = " << l.tp << "\npipeline_parallel_degree = " << p.pp
     << "\npipeline_parallel_schedule = " << quoted(schedule_name(p.schedule))
     << "\npipeline_parallel_microbatch_size = " << p.micro_batch
     << "\ncontext_parallel_degree = 1\nexpert_parallel_degree = 1\n";
  if (p.pp > 1) os << "module_fqns_per_model_part = " << model_parts(p) << "\n";
  os << "\n[activation_checkpoint]\nmode = " << quoted(to_string(l.recompute)) << "\n";
  // Stratagem's selective recompute rebuilds the attention core; torchtitan's op-level
  // selective checkpointing is the nearest policy.
  if (l.recompute == Recompute::selective) os << "selective_ac_option = \"op\"\n";
  return os.str();
}

}  // namespace stratagem::interop
