// Plan -> Megatron-LM pretrain_gpt.py arguments, one flag per line (names checked against
// test/data/frameworks/megatron-lm.txt). megatron_args.cpp reads them back into the same plan.
#include <cmath>
#include <sstream>

#include "src/interop/plan_shape.hpp"
#include "stratagem/error.hpp"
#include "stratagem/interop.hpp"

namespace stratagem::interop {

namespace {

class ArgsWriter {
 public:
  void flag(const std::string& name) { os_ << name << "\n"; }
  template <class T>
  void value(const std::string& name, const T& v) {
    os_ << name << " " << v << "\n";
  }
  // One line whatever the names in it hold: a newline would start a line that the launch
  // recipe's $(grep -v '^#' FILE) passes to Megatron as flags.
  void comment(const std::string& text) { os_ << "# " << shorten(text, text.size()) << "\n"; }
  std::string str() const { return os_.str(); }

 private:
  std::ostringstream os_;
};

void write_model(ArgsWriter& w, const ModelSpec& m) {
  w.value("--num-layers", m.layers);
  w.value("--hidden-size", m.hidden);
  w.value("--ffn-hidden-size", m.ffn_hidden);
  w.value("--num-attention-heads", m.heads);
  if (m.kv_heads != m.heads) {
    w.flag("--group-query-attention");
    w.value("--num-query-groups", m.kv_heads);
  }
  w.value("--seq-length", m.seq_len);
  w.value("--max-position-embeddings", m.seq_len);
  w.value("--vocab-size", m.vocab);
  w.value("--normalization", m.norm == Norm::rmsnorm ? "RMSNorm" : "LayerNorm");
  if (m.activation == Activation::swiglu) w.flag("--swiglu");
  w.value("--position-embedding-type", m.position == Position::rope ? "rope" : "learned_absolute");
  if (!m.tied_embeddings) w.flag("--untie-embeddings-and-output-weights");
  if (!m.bias) w.flag("--disable-bias-linear");
  if (m.qkv_bias && !m.bias) w.flag("--add-qkv-bias");
  // RoPE where it is not Megatron-LM's default (--rotary-base 10000, --rotary-percent 1.0);
  // --use-rope-scaling is Llama 3.x's scaling, of --rope-scaling-factor (default 8.0).
  if (m.position == Position::rope) {
    if (m.rope.base != 10000) {
      // --rotary-base is an int in arguments.py.
      if (m.rope.base != std::floor(m.rope.base) || m.rope.base > 2147483647.0)
        throw InputError("export --to megatron: the model's RoPE base " +
                         std::to_string(m.rope.base) +
                         " is not an integer, which Megatron-LM's --rotary-base requires");
      w.value("--rotary-base", int64_t(m.rope.base));
    }
    if (m.rope.percent != 1.0) w.value("--rotary-percent", m.rope.percent);
    if (m.rope.llama3_factor > 0) {
      w.flag("--use-rope-scaling");
      w.value("--rope-scaling-factor", m.rope.llama3_factor);
    }
  }
  if (!m.dropout) {
    w.value("--attention-dropout", "0.0");
    w.value("--hidden-dropout", "0.0");
  }
  if (m.moe.enabled()) {
    // Megatron-Core's MoE layer (megatron/training/arguments.py _add_moe_args): the routed
    // experts, top-k, each expert's width, the shared experts' total width, which layers are
    // MoE (a Python list expression), and the dispatcher stratagem prices (all-to-all).
    w.value("--num-experts", m.moe.experts);
    w.value("--moe-router-topk", m.moe.top_k);
    w.value("--moe-ffn-hidden-size", m.moe.expert_ffn_hidden);
    if (m.moe.shared_experts > 0)
      w.value("--moe-shared-expert-intermediate-size",
              int64_t(m.moe.shared_experts) * m.moe.expert_ffn_hidden);
    if (m.moe.dense_layers > 0)
      w.value("--moe-layer-freq", "\"([0]*" + std::to_string(m.moe.dense_layers) + "+[1]*" +
                                      std::to_string(m.layers - m.moe.dense_layers) + ")\"");
    if (m.moe.router_score == RouterScore::sigmoid)
      w.value("--moe-router-score-function", "sigmoid");
    w.value("--moe-token-dispatcher-type", "alltoall");
    w.flag("--moe-grouped-gemm");
  }
}

void write_parallel(ArgsWriter& w, const Plan& p, const ModelSpec& m) {
  const LayerStrategy& l = p.layers.front();
  // The MoE layers' expert degrees (the dense layers keep 1; Megatron sets one pair for all).
  int ep = 1, etp = 1;
  for (int k = 0; k < int(p.layers.size()); ++k)
    if (m.is_moe_layer(k)) ep = p.layers[k].ep, etp = p.layers[k].etp;
  w.value("--tensor-model-parallel-size", l.tp);
  w.value("--pipeline-model-parallel-size", p.pp);
  if (p.vpp > 1) w.value("--num-layers-per-virtual-pipeline-stage", p.chunks.front().size());
  // Megatron-Core groups pp micro-batches per virtual stage unless told otherwise.
  if (const int g = p.microbatch_group_size(p.num_microbatches());
      p.schedule == Schedule::interleaved && g != p.pp)
    w.value("--microbatch-group-size-per-virtual-pipeline-stage", g);
  if (auto split = detail::first_last_split(p); split && split->first > 0) {
    w.value("--decoder-first-pipeline-num-layers", split->first);
    w.value("--decoder-last-pipeline-num-layers", split->last);
  }
  w.value("--context-parallel-size", 1);
  w.value("--expert-model-parallel-size", ep);
  if (m.moe.enabled()) w.value("--expert-tensor-parallel-size", etp);
  if (l.sequence_parallel && l.tp > 1) w.flag("--sequence-parallel");
  const auto rc = detail::recompute_shape(p);
  if (rc->mode == Recompute::selective) w.value("--recompute-granularity", "selective");
  if (rc->mode == Recompute::full) {
    w.value("--recompute-granularity", "full");
    w.value("--recompute-method", rc->block_layers > 0 ? "block" : "uniform");
    w.value("--recompute-num-layers", rc->block_layers > 0 ? rc->block_layers : 1);
  }
  if (l.zero == 1) w.flag("--use-distributed-optimizer");
  w.value("--micro-batch-size", p.micro_batch);
  w.value("--global-batch-size", p.global_batch);
  if (p.overlap_grad_reduce) w.flag("--overlap-grad-reduce");
  if (p.overlap_grad_reduce && l.zero == 1) w.flag("--overlap-param-gather");
  if (p.dtype == Dtype::bf16) w.flag("--bf16");
  if (p.dtype == Dtype::fp16) w.flag("--fp16");
  if (p.flash_attention) w.flag("--use-flash-attn");
}

}  // namespace

std::string export_megatron(const Plan& p, const ModelSpec& m, const ClusterSpec& c) {
  ArgsWriter w;
  w.comment("Megatron-LM pretrain_gpt.py arguments, written by stratagem export for " + m.name +
            " on " + c.name);
  w.comment("plan: " + p.describe());
  w.comment("launch on " + std::to_string(c.nodes) + " node(s) x " +
            std::to_string(c.node.gpus_per_node) + " GPUs: torchrun --nnodes " +
            std::to_string(c.nodes) + " --nproc-per-node " + std::to_string(c.node.gpus_per_node) +
            " pretrain_gpt.py $(grep -v '^#' THIS_FILE) plus your data, tokenizer, learning-rate "
            "and checkpoint flags");
  w.comment(
      "--vocab-size is the model's vocabulary (Megatron pads it to "
      "--make-vocab-size-divisible-by x tp; a tokenizer of your own sets it instead)");
  write_model(w, m);
  write_parallel(w, p, m);
  return w.str();
}

}  // namespace stratagem::interop
