// What each framework's job description can hold of a plan, and the nearest plan it can hold.
#include <algorithm>

#include "src/interop/plan_shape.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/interop.hpp"

namespace stratagem::interop {

using detail::runs;
using detail::uniform_by;

Target target_from_string(const std::string& s, const std::string& flag) {
  if (s == "megatron") return Target::megatron;
  if (s == "torchtitan") return Target::torchtitan;
  if (s == "deepspeed") return Target::deepspeed;
  throw InputError(flag + ": unknown target '" + shorten(s) +
                   "' (expected megatron, torchtitan or deepspeed)");
}

const char* to_string(Target t) {
  return t == Target::megatron     ? "Megatron-LM"
         : t == Target::torchtitan ? "torchtitan"
                                   : "DeepSpeed";
}

namespace {

std::string degrees(const LayerStrategy& l) {
  return "tp" + std::to_string(l.tp) + " dp" + std::to_string(l.dp);
}
std::string offload(const LayerStrategy& l) {
  std::string s = std::string(l.offload_optimizer ? "optimizer," : "") +
                  (l.offload_params ? "params," : "") +
                  (l.offload_activations ? "activations," : "");
  return s.empty() ? "no offload" : "offload " + s.substr(0, s.size() - 1);
}

// What no target here expresses: strategies that differ by layer, or an embedding unlike them.
void common_limits(const Plan& p, std::vector<Unexpressible>& out) {
  if (!uniform_by(p, degrees))
    out.push_back({"per-layer tensor/data-parallel degrees", runs(p, degrees)});
  auto sp = [](const LayerStrategy& l) {
    return std::string(l.sequence_parallel ? "sp" : "no sp");
  };
  if (!uniform_by(p, sp)) out.push_back({"per-layer sequence parallelism", runs(p, sp)});
  auto zero = [](const LayerStrategy& l) { return "ZeRO-" + std::to_string(l.zero); };
  if (!uniform_by(p, zero)) out.push_back({"per-layer ZeRO stages", runs(p, zero)});
  if (!uniform_by(p, offload)) out.push_back({"per-layer offload", runs(p, offload)});
  const LayerStrategy& l = p.layers.front();
  const LayerStrategy& e = p.embedding;
  // The exports write no context-parallel degree yet (Megatron-Core's
  // --context-parallel-size, torchtitan's context_parallel_degree): refused, not dropped.
  if (e.cp > 1)
    out.push_back({"context parallelism", "cp " + std::to_string(e.cp) + " " +
                                              to_string(l.cp_kind) +
                                              " (the exports do not write it yet)"});
  if (e.tp != l.tp || e.dp != l.dp || e.zero != l.zero ||
      e.sequence_parallel != l.sequence_parallel || e.offload_optimizer != l.offload_optimizer ||
      e.offload_params != l.offload_params)
    out.push_back({"an embedding strategy unlike the layers'",
                   "embedding " + e.describe() + ", layers " + l.describe()});
}

std::string all_layers(const Plan& p, const std::string& what) {
  return "layers 0-" + std::to_string(p.layers.size() - 1) + " " + what;
}

void megatron_limits(const Plan& p, std::vector<Unexpressible>& out) {
  const LayerStrategy& l = detail::most_common(p);
  if (l.zero >= 2)
    out.push_back({"ZeRO-" + std::to_string(l.zero) +
                       " (Megatron's distributed optimizer shards the optimizer states: ZeRO-1)",
                   all_layers(p, "ZeRO-" + std::to_string(l.zero))});
  for (const auto& x : p.layers)
    if (x.offload_optimizer || x.offload_params || x.offload_activations) {
      out.push_back(
          {"offload (the Megatron-LM arguments read have no offload flag)", runs(p, offload)});
      break;
    }
  if (p.schedule == Schedule::gpipe && p.pp > 1)
    out.push_back({"the GPipe schedule (Megatron runs 1F1B or interleaved 1F1B)", "all stages"});
  // Megatron-LM d98e8a64: no zero-bubble flag in arguments.py (only the sail-sg fork has one).
  if (splits_backward(p.schedule))
    out.push_back({std::string("the ") + to_string(p.schedule) +
                       " schedule (Megatron-LM's arguments have no zero-bubble schedule: it runs "
                       "1F1B or interleaved 1F1B)",
                   "all stages"});
  if (!detail::recompute_shape(p))
    out.push_back(
        {"per-layer recompute other than Megatron's block method (the first N layers "
         "of every chunk)",
         runs(p, [](const LayerStrategy& x) { return std::string(to_string(x.recompute)); })});
  const bool split_ok =
      p.vpp > 1 ? detail::chunks_equal(p) : detail::first_last_split(p).has_value();
  if (!split_ok) {
    std::string sizes;
    for (const auto& c : p.chunks) sizes += (sizes.empty() ? "" : ", ") + std::to_string(c.size());
    out.push_back({p.vpp > 1 ? "unequal virtual pipeline stages"
                             : "a stage split with unequal middle stages (Megatron sets the "
                               "first and last stage apart, the others equal)",
                   "layers per chunk " + sizes});
  }
}

void torchtitan_limits(const Plan& p, std::vector<Unexpressible>& out) {
  const LayerStrategy& l = detail::most_common(p);
  if (l.zero == 1 || l.zero == 2)
    out.push_back({"ZeRO-" + std::to_string(l.zero) +
                       " (torchtitan shards with FSDP, ZeRO-3, or replicates with DDP)",
                   all_layers(p, "ZeRO-" + std::to_string(l.zero))});
  if (l.tp > 1 && !l.sequence_parallel)
    out.push_back(
        {"tensor parallelism without sequence parallelism (torchtitan's tensor-parallel "
         "plan shards the norms over the sequence)",
         all_layers(p, degrees(l) + " no sp")});
  const bool fsdp_offload = l.offload_params && l.offload_optimizer && l.zero == 3;
  if ((l.offload_params || l.offload_optimizer || l.offload_activations) &&
      !(fsdp_offload && !l.offload_activations))
    out.push_back(
        {"this offload (torchtitan's enable_cpu_offload moves parameters, gradients and "
         "optimizer states together, under FSDP)",
         runs(p, offload)});
  if (!uniform_by(p, [](const LayerStrategy& x) { return std::string(to_string(x.recompute)); }))
    out.push_back({"per-layer recompute", runs(p, [](const LayerStrategy& x) {
                     return std::string(to_string(x.recompute));
                   })});
  if (!p.overlap_grad_reduce)
    out.push_back({"gradient reduction not overlapped with backward (torchtitan always overlaps)",
                   "all layers"});
  // torch.distributed.pipelining's zero-bubble schedules (InterleavedZeroBubble, ZBVZeroBubble,
  // DualPipeV) take two or more stages a rank; ZB-H1 and H2 run one.
  if (splits_backward(p.schedule))
    out.push_back({std::string("the ") + to_string(p.schedule) +
                       " schedule (torchtitan's zero-bubble schedules, InterleavedZeroBubble and "
                       "ZBVZeroBubble, run two or more stages a rank)",
                   "all stages"});
  if (p.dtype == Dtype::fp16 || p.dtype == Dtype::tf32)
    out.push_back({std::string(to_string(p.dtype)) +
                       " (torchtitan's mixed_precision_param is bfloat16 or float32)",
                   "all layers"});
}

void deepspeed_limits(const Plan& p, std::vector<Unexpressible>& out) {
  const LayerStrategy& l = detail::most_common(p);
  if (p.pp > 1 && l.zero >= 2)
    out.push_back(
        {"ZeRO-" + std::to_string(l.zero) +
             " with pipeline parallelism (DeepSpeed's pipeline engine takes ZeRO-1 at most)",
         all_layers(p, "ZeRO-" + std::to_string(l.zero))});
  if (l.offload_params && l.zero < 3)
    out.push_back({"parameter offload below ZeRO-3 (DeepSpeed offloads parameters under ZeRO-3)",
                   runs(p, offload)});
  if (l.offload_activations && l.recompute != Recompute::full)
    out.push_back(
        {"activation offload without full recompute (DeepSpeed's cpu_checkpointing "
         "moves the checkpoints of full recompute)",
         runs(p, offload)});
  if (p.pp > 1 && p.schedule != Schedule::one_f_one_b)
    out.push_back({std::string("the ") + to_string(p.schedule) +
                       " schedule (DeepSpeed's pipeline engine runs 1F1B)",
                   "all stages"});
  if (p.pp > 1 && p.chunks != even_chunks(int(p.layers.size()), int(p.chunks.size())))
    out.push_back({"an uneven stage split (Megatron-DeepSpeed splits the layers evenly)",
                   "pp " + std::to_string(p.pp)});
  if (l.sequence_parallel && l.tp > 1)
    out.push_back({"sequence parallelism (not among the Megatron-DeepSpeed arguments read)",
                   all_layers(p, "sp")});
  auto rc = [](const LayerStrategy& x) { return std::string(to_string(x.recompute)); };
  if (!uniform_by(p, rc) || l.recompute == Recompute::selective)
    out.push_back(
        {"recompute other than none or full on every layer (Megatron-DeepSpeed's "
         "--checkpoint-activations)",
         runs(p, rc)});
}

}  // namespace

std::vector<Unexpressible> unexpressible(const Plan& p, const ModelSpec&, Target t) {
  std::vector<Unexpressible> out;
  common_limits(p, out);
  if (t == Target::megatron) megatron_limits(p, out);
  if (t == Target::torchtitan) torchtitan_limits(p, out);
  if (t == Target::deepspeed) deepspeed_limits(p, out);
  return out;
}

namespace {

// The most common layer strategy with what the target lacks mapped to its nearest equivalent.
LayerStrategy nearest_layer(const Plan& p, const ModelSpec& m, Target t) {
  LayerStrategy l = detail::most_common(p);
  if (t == Target::megatron) {
    l.zero = std::min(l.zero, 1);
    l.offload_optimizer = l.offload_params = l.offload_activations = false;
  }
  if (t == Target::torchtitan) {
    if (l.zero == 1 || l.zero == 2) l.zero = 3;
    if (l.tp > 1 && m.seq_len % l.tp == 0) l.sequence_parallel = true;
    const bool any = l.offload_params || l.offload_optimizer;
    l.offload_params = l.offload_optimizer = any && l.zero == 3;
    l.offload_activations = false;
  }
  if (t == Target::deepspeed) {
    if (p.pp > 1) l.zero = std::min(l.zero, 1);
    if (l.zero < 3) l.offload_params = false;
    if (l.recompute == Recompute::selective) l.recompute = Recompute::full;
    if (l.recompute != Recompute::full) l.offload_activations = false;
    l.sequence_parallel = false;
  }
  return l;
}

// Megatron without virtual stages: the even split, or where the layers do not divide, the extra
// layers on the first stage.
std::vector<LayerRange> nearest_split(const Plan& p, int layers, Target t) {
  const int n = int(p.chunks.size());
  if (t != Target::megatron || n == 1 || layers % n == 0) return even_chunks(layers, n);
  const int middle = layers / n;
  std::vector<LayerRange> out{{0, layers - middle * (n - 1)}};
  for (int s = 1; s < n; ++s) out.push_back({out.back().end, out.back().end + middle});
  return out;
}

}  // namespace

Plan nearest_expressible(const Plan& p, const ModelSpec& m, const ClusterSpec& c, Target t) {
  Plan q = p;
  const LayerStrategy l = nearest_layer(p, m, t);
  // The same samples per micro-batch through a stage, now all at the layer's dp.
  const int64_t stage_mb = int64_t(p.micro_batch) * p.max_dp();
  q.layers.assign(p.layers.size(), l);
  q.embedding = l;
  q.embedding.recompute = Recompute::none;
  q.embedding.offload_activations = false;
  q.micro_batch = int(stage_mb / l.dp);
  if (t == Target::torchtitan) {
    q.overlap_grad_reduce = true;
    if (q.dtype == Dtype::fp16 || q.dtype == Dtype::tf32) q.dtype = Dtype::bf16;
  }
  const bool schedule_ok =
      (t == Target::torchtitan && !splits_backward(q.schedule)) ||
      (t == Target::megatron && q.schedule != Schedule::gpipe && !splits_backward(q.schedule)) ||
      (t == Target::deepspeed && q.schedule == Schedule::one_f_one_b);
  const int layers = int(p.layers.size());
  if (!schedule_ok || (t == Target::megatron && q.vpp > 1 && layers % (q.pp * q.vpp))) {
    q.schedule = Schedule::one_f_one_b;
    q.vpp = 1;
    q.chunks = even_chunks(layers, q.pp);
  }
  if (!unexpressible(q, m, t).empty()) q.chunks = nearest_split(q, layers, t);
  validate(q, m, c, std::string("the nearest ") + to_string(t) + " plan");
  if (auto left = unexpressible(q, m, t); !left.empty())
    throw InputError("--nearest: no plan near this one that " + std::string(to_string(t)) +
                     " can express: " + left.front().feature + " (" + left.front().where + ")");
  return q;
}

std::optional<Plan> nearest_fitting(const Plan& p, const ModelSpec& m, const ClusterSpec& c,
                                    const FrameworkSpec& fw, Target t) {
  if (fits_gpu_memory(estimate(CostModel(m, c, p.dtype, fw), p), c)) return p;
  // Each knob only ever moves towards less memory from where the plan has it, so the plans
  // tried are the plan with some of its memory given back for time, never a different layout.
  struct Offload {
    bool optimizer, params;
  };
  const Offload offloads[] = {{false, false}, {true, false}, {true, true}};
  const Recompute recomputes[] = {Recompute::none, Recompute::selective, Recompute::full};
  std::optional<Plan> best;
  double best_time = 0;
  for (int mb = p.micro_batch; mb >= 1; --mb) {
    if (p.micro_batch % mb) continue;
    for (int zero = 0; zero <= 3; ++zero)
      for (Recompute rc : recomputes)
        for (const Offload& o : offloads) {
          Plan q = p;
          q.micro_batch = mb;
          auto give_back = [&](LayerStrategy& l) {
            l.zero = std::max(l.zero, zero);
            l.offload_optimizer = l.offload_optimizer || o.optimizer;
            l.offload_params = l.offload_params || o.params;
          };
          for (LayerStrategy& l : q.layers) {
            give_back(l);
            l.recompute = std::max(l.recompute, rc);
          }
          give_back(q.embedding);  // the embedding has no recompute (nearest_expressible)
          if (!unexpressible(q, m, t).empty()) continue;
          try {
            validate(q, m, c, "the nearest plan that fits");
          } catch (const InputError&) {
            continue;  // e.g. offloaded weights without ZeRO-3: not a plan
          }
          const Estimate e = estimate(CostModel(m, c, q.dtype, fw), q);
          // Strictly faster: of equally fast plans the first found, which changes the least.
          if (fits_gpu_memory(e, c) && (!best || e.iteration_time_s < best_time)) {
            best = q;
            best_time = e.iteration_time_s;
          }
        }
  }
  return best;
}

std::string export_plan(const Plan& p, const ModelSpec& m, const ClusterSpec& c, Target t) {
  if (auto bad = unexpressible(p, m, t); !bad.empty()) {
    std::string msg = std::string("export --to ") +
                      (t == Target::megatron     ? "megatron"
                       : t == Target::torchtitan ? "torchtitan"
                                                 : "deepspeed") +
                      ": " + to_string(t) + " cannot express ";
    for (size_t i = 0; i < bad.size(); ++i)
      msg += (i ? "; " : "") + bad[i].feature + " (" + bad[i].where + ")";
    throw InputError(msg + " (--nearest exports the nearest plan it can)");
  }
  if (t == Target::megatron) return export_megatron(p, m, c);
  if (t == Target::torchtitan) return export_torchtitan(p, m, c);
  return export_deepspeed(p, m, c);
}

}  // namespace stratagem::interop
