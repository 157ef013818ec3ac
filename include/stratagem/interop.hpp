// Interoperability with the tools people already train with: Hugging Face model configs and
// Megatron-LM command lines in; Megatron-LM arguments, torchtitan TOML and DeepSpeed JSON out.
#pragma once
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "stratagem/cluster.hpp"
#include "stratagem/framework.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"

namespace stratagem::interop {

// ---- Hugging Face config.json (hf_config.cpp) --------------------------------------------------

// A Hugging Face config names its class in `architectures` or its family in `model_type`.
bool is_hf_config(const nlohmann::json& j);
// The ModelSpec of a LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel or
// GPTNeoXForCausalLM config. `seq_len` replaces the config's context length (a sliding window
// shorter than the sequence is refused, as it changes the attention cost). Throws InputError
// naming `source` and the field; MoE architectures name the missing feature.
ModelSpec model_from_hf_config(const nlohmann::json& j, const std::string& source,
                               std::optional<int> seq_len = std::nullopt);
// What the import approximates, one line each (empty: nothing), for the user to see.
std::vector<std::string> hf_import_notes(const nlohmann::json& j);
// --model NAME|FILE.json where FILE may also be a Hugging Face config.json.
ModelSpec load_model_or_hf(const std::string& name_or_path,
                           std::optional<int> seq_len = std::nullopt);

// ---- Megatron-LM command lines (megatron_args.cpp) ---------------------------------------------

// Splits the text of an arguments file as a shell would split a command line: whitespace,
// quotes, backslash-newline continuations and `#` comments.
std::vector<std::string> split_command_line(const std::string& text, const std::string& source);

struct MegatronJob {
  ModelSpec model;
  Plan plan;
  // Flags read but not about the model or the plan (learning rate, data paths, ...).
  std::vector<std::string> ignored_flags;
  // What the reading approximates, one line each.
  std::vector<std::string> notes;
};

// The job's size as the user gave it to stratagem (--nodes, --gpus-per-node), already applied
// to the cluster: it wins over the launcher's flags in the job's command line.
struct JobSize {
  std::optional<int> nodes, gpus_per_node;
};

// Reads the model and parallel flags of a pretrain_gpt.py command line (launcher tokens before
// the script, such as torchrun's --nnodes and --nproc-per-node, set the world size where
// `user_size` does not; otherwise `cluster` does). A flag given twice takes its last value, as
// argparse. Throws InputError naming `source` and the flag.
MegatronJob megatron_job_from_args(const std::vector<std::string>& args, ClusterSpec& cluster,
                                   const std::string& source, const JobSize& user_size = {});

// ---- export (export_*.cpp) ---------------------------------------------------------------------

enum class Target { megatron, torchtitan, deepspeed };
Target target_from_string(const std::string& s, const std::string& flag);
const char* to_string(Target t);

// A plan feature that a target cannot express, and where the plan uses it.
struct Unexpressible {
  std::string feature;  // e.g. "per-layer tensor-parallel degrees"
  std::string where;    // e.g. "layers 0-47 tp 8, layers 48-95 tp 4"
};
std::vector<Unexpressible> unexpressible(const Plan& p, const ModelSpec& m, Target t);
// The nearest plan the target can express: the most common per-layer strategy applied to every
// layer, features the target lacks dropped or mapped to their closest equivalent, an even stage
// split where the target's split cannot hold the plan's. Validated against `c`.
Plan nearest_expressible(const Plan& p, const ModelSpec& m, const ClusterSpec& c, Target t);
// The nearest plan to `p` that the target can express and whose forecast fits (fits_gpu_memory):
// the same layout (tp, cp, dp, pp, stages), with only what trades time for memory changed on
// every layer -- ZeRO stage, recompute, offload -- and the micro-batch cut to a divisor of
// `p`'s; among those, the fastest forecast. `p` itself when it fits; nullopt when none does.
std::optional<Plan> nearest_fitting(const Plan& p, const ModelSpec& m, const ClusterSpec& c,
                                    const FrameworkSpec& fw, Target t);

// The text of the target's job description. Throws InputError listing unexpressible features.
std::string export_plan(const Plan& p, const ModelSpec& m, const ClusterSpec& c, Target t);
std::string export_megatron(const Plan& p, const ModelSpec& m, const ClusterSpec& c);
std::string export_torchtitan(const Plan& p, const ModelSpec& m, const ClusterSpec& c);
std::string export_deepspeed(const Plan& p, const ModelSpec& m, const ClusterSpec& c);
// The Megatron-DeepSpeed pretrain_gpt.py flags that go with a ds_config.json at `config_path`.
std::string megatron_deepspeed_flags(const Plan& p, const std::string& config_path);

// ---- partial nodes (partial_node.cpp) ----------------------------------------------------------

// A job on `gpus` of a node's GPUs: the node's shared links and host are divided honestly
// (see data/clusters/README.md, "A job on part of a node"). Throws InputError naming `flag`.
void restrict_to_gpus(ClusterSpec& c, int gpus, const std::string& flag);

}  // namespace stratagem::interop
