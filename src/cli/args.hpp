// Command-line parsing shared by every subcommand: one place reads --model/--cluster/plan flags.
#pragma once
#include <climits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "stratagem/cluster.hpp"
#include "stratagem/framework.hpp"
#include "stratagem/model.hpp"
#include "stratagem/plan.hpp"

namespace stratagem::cli {

class Args {
 public:
  Args(std::string command, std::vector<std::string> tokens);
  const std::string& command() const { return command_; }
  // `--flag value` or `--flag=value`; each flag may appear once.
  std::optional<std::string> value(const std::string& flag);
  // Integers outside [lo, hi] (by default int's range) and non-finite numbers are bad input,
  // reported with the text as written.
  std::optional<int> int_value(const std::string& flag, int lo = INT_MIN, int hi = INT_MAX);
  std::optional<double> double_value(const std::string& flag);
  // A number in [lo, hi] (`what` says what is expected, for the message).
  std::optional<double> double_in(const std::string& flag, double lo, double hi,
                                  const std::string& what);
  // A file this command writes. finish() checks it (io::check_output_path: a regular file or a
  // new one, in a folder that exists) and refuses it when it names the same file as any other
  // argument: an output that is also an input would destroy the input.
  std::optional<std::string> output(const std::string& flag);
  // A file this command reads that its argument does not name as a path: a built-in resolved
  // from a name (--model gpt2-124m reads data/models/gpt2-124m.json) or a default. finish()
  // refuses an output that is the same file, as it does for a path given as an argument.
  void input(const std::string& flag, const std::string& given, const std::string& path);
  // A folder the command owns while it runs (train's --ckpt-dir: its checkpoints are inputs
  // under --resume, and rotation, --overwrite and the lock's release remove its files).
  // finish() refuses any output inside it, and any other argument naming a file inside it.
  void owned_folder(const std::string& flag, const std::string& dir);
  std::string required(const std::string& flag);
  bool flag(const std::string& name);  // a switch without a value
  std::vector<std::string> positionals();
  // Fails on any flag that no one asked for (a typo must not be silently ignored).
  void finish();
  // The tokens after a lone "--", for a command that reads them as another program would;
  // finish() refuses them where no command took them.
  std::vector<std::string> take_passthrough() {
    passthrough_taken_ = true;
    return passthrough_;
  }

 private:
  std::string command_;
  std::vector<std::string> tokens_;
  std::vector<std::string> passthrough_;
  bool has_separator_ = false, passthrough_taken_ = false;
  std::vector<bool> used_;
  std::vector<std::pair<std::string, std::string>> outputs_;  // flag, path
  struct Resolved {
    std::string flag, given, path;
  };
  std::vector<Resolved> inputs_;                                    // input()
  std::vector<std::pair<std::string, std::string>> owned_folders_;  // flag, folder
  void check_outputs() const;
  void refuse_argument_input(const std::string& flag, const std::string& path) const;
  void refuse_resolved_input(const std::string& flag, const std::string& path) const;
  void refuse_inside_owned_folder(const std::string& flag, const std::string& path) const;
  void refuse_arguments_inside_owned_folders() const;
};

// --model NAME|FILE.json plus inline overrides --layers --hidden --heads --kv-heads
// --ffn-hidden --vocab --seq-len (alone they describe a GPT-2-style decoder), and the MoE flags
// --experts --top-k --expert-ffn-hidden --shared-experts --dense-layers.
ModelSpec model_from_args(Args& a);
// --cluster NAME|FILE.json (default dgx-a100-80g) and --nodes N.
ClusterSpec cluster_from_args(Args& a, const char* default_cluster = "dgx-a100-80g");
// --framework NAME|FILE.json (default stratagem): the training software (data/frameworks).
// --framework, or `fallback` where it is not given (a job imported from a framework is priced as
// that framework runs it).
FrameworkSpec framework_from_args(Args& a, const std::string& fallback = "stratagem");
// --plan FILE or the Megatron-style shorthand; validated against model and cluster.
Plan plan_from_args(Args& a, const ModelSpec& m, const ClusterSpec& c);
PlanShorthand shorthand_from_args(Args& a);

extern const char* kModelHelp;
extern const char* kClusterHelp;
extern const char* kPlanHelp;
extern const char* kFrameworkHelp;

}  // namespace stratagem::cli
