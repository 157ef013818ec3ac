// Plan -> DeepSpeed ds_config.json (keys checked against test/data/frameworks/deepspeed.txt) and
// the Megatron-DeepSpeed flags that go beside it (test/data/frameworks/megatron-deepspeed.txt).
#include <nlohmann/json.hpp>

#include "src/interop/plan_shape.hpp"
#include "stratagem/interop.hpp"

namespace stratagem::interop {

std::string export_deepspeed(const Plan& p, const ModelSpec&, const ClusterSpec&) {
  const LayerStrategy& l = p.layers.front();
  nlohmann::ordered_json j;
  j["train_batch_size"] = p.global_batch;
  j["train_micro_batch_size_per_gpu"] = p.micro_batch;
  j["gradient_accumulation_steps"] = p.num_microbatches();
  j["bf16"] = {{"enabled", p.dtype == Dtype::bf16}};
  j["fp16"] = {{"enabled", p.dtype == Dtype::fp16}};
  nlohmann::ordered_json z;
  z["stage"] = l.zero;
  z["overlap_comm"] = p.overlap_grad_reduce;
  z["contiguous_gradients"] = true;
  if (l.offload_optimizer) z["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (l.offload_params) z["offload_param"] = {{"device", "cpu"}, {"pin_memory", true}};
  j["zero_optimization"] = z;
  if (l.recompute == Recompute::full)
    j["activation_checkpointing"] = {{"partition_activations", false},
                                     {"cpu_checkpointing", l.offload_activations},
                                     {"contiguous_memory_optimization", false}};
  return j.dump(2) + "\n";
}

std::string megatron_deepspeed_flags(const Plan& p, const std::string& config_path) {
  const LayerStrategy& l = p.layers.front();
  std::string out = "--tensor-model-parallel-size " + std::to_string(l.tp) +
                    " --pipeline-model-parallel-size " + std::to_string(p.pp) +
                    " --micro-batch-size " + std::to_string(p.micro_batch) +
                    " --global-batch-size " + std::to_string(p.global_batch) + " --zero-stage " +
                    std::to_string(l.zero);
  if (l.recompute == Recompute::full)
    out +=
        " --checkpoint-activations --checkpoint-num-layers 1 --deepspeed-activation-checkpointing";
  if (l.recompute == Recompute::full && l.offload_activations) out += " --checkpoint-in-cpu";
  if (p.dtype == Dtype::bf16) out += " --bf16";
  if (p.dtype == Dtype::fp16) out += " --fp16";
  return out + " --deepspeed --deepspeed_config " + config_path;
}

}  // namespace stratagem::interop
