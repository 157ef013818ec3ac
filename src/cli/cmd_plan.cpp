#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "src/cli/command.hpp"
#include "src/cli/memory_check.hpp"
#include "src/cli/model_support.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/input_file.hpp"
#include "stratagem/interop.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/limits.hpp"
#include "stratagem/output_file.hpp"
#include "stratagem/spec_json.hpp"

namespace stratagem::cli {
namespace {

nlohmann::json layout_summary(const Plan& p, const ClusterSpec& c, const Layout& L) {
  nlohmann::json stages = nlohmann::json::array();
  for (int s = 0; s < p.pp; ++s) {
    nlohmann::json chunks = nlohmann::json::array();
    for (int ch = s; ch < (int)p.chunks.size(); ch += p.pp)
      chunks.push_back({p.chunks[ch].begin, p.chunks[ch].end});
    int first = L.rank_of(s, 0), last = L.rank_of(s, L.devices_per_stage() - 1);
    stages.push_back({{"stage", s},
                      {"layers", chunks},
                      {"ranks", {first, last}},
                      {"nodes", {L.coords(first).node, L.coords(last).node}}});
  }
  std::map<std::string, int> counts;
  bool tp_in_node = true;
  for (const auto& g : L.groups()) {
    counts[to_string(g.kind)]++;
    if (g.kind == GroupKind::tp) {
      int n0 = L.coords(g.ranks.front()).node;
      for (int r : g.ranks) tp_in_node &= L.coords(r).node == n0;
    }
  }
  return {{"world_size", L.world_size()},
          {"nodes", c.nodes},
          {"gpus_per_node", c.node.gpus_per_node},
          {"pp", p.pp},
          {"devices_per_stage", L.devices_per_stage()},
          {"num_microbatches", p.num_microbatches()},
          {"tp_degrees", L.tp_degrees()},
          {"tp_groups_within_node", tp_in_node},
          {"group_counts", counts},
          {"stages", stages}};
}

int run_plan_check(Args& a) {
  const bool json = a.flag("--json");
  auto out = a.output("-o");
  ModelSpec m = model_from_args(a);
  require_supported_model(m, a.command(), ModelUse::forecast);
  ClusterSpec c = cluster_from_args(a);
  Plan p = plan_from_args(a, m, c);
  a.finish();
  check_layout_memory(p, c, local_size(), a.command());  // before the Layout exists
  Layout L(p, c);
  auto summary = layout_summary(p, c, L);
  if (out && world_rank() == 0) io::write_output("-o", *out, to_json(p).dump(2) + "\n");
  if (json) {
    nlohmann::json j;
    j["valid"] = true;
    j["model"] = m.name;
    j["cluster"] = c.name;
    j["layout"] = summary;
    j["plan"] = to_json(p);
    print_json(j);
    return 0;
  }
  if (world_rank() != 0) return 0;
  std::printf("plan OK: %s on %s x %d nodes\n  %s\n", m.name.c_str(), c.name.c_str(), c.nodes,
              p.describe().c_str());
  std::printf("layout: %d ranks = pp %d x %d per stage; %d micro-batches of %d per replica\n",
              L.world_size(), p.pp, L.devices_per_stage(), p.num_microbatches(), p.micro_batch);
  std::printf("  tensor groups inside one node: %s\n",
              summary["tp_groups_within_node"].get<bool>() ? "yes" : "NO (tp crosses nodes)");
  for (const auto& s : summary["stages"])
    std::printf("  stage %3d: layers %s ranks %d-%d nodes %d-%d\n", s["stage"].get<int>(),
                s["layers"].dump().c_str(), s["ranks"][0].get<int>(), s["ranks"][1].get<int>(),
                s["nodes"][0].get<int>(), s["nodes"][1].get<int>());
  for (auto& [k, v] : summary["group_counts"].items())
    std::printf("  %-15s groups: %d\n", k.c_str(), v.get<int>());
  if (out) std::printf("wrote %s\n", out->c_str());
  return 0;
}

Register reg{{"plan check", "validate a plan, print its layout, write the expanded plan",
              std::string("usage: stratagem plan check --model M --cluster C --nodes N "
                          "(--plan FILE | shorthand flags) [-o plan.json] [--json]\n") +
                  kModelHelp + kClusterHelp + kPlanHelp,
              run_plan_check}};

// One word as a POSIX shell reads it back: bare when no character in it is special to a shell,
// else single-quoted (a quote inside written '\'').
std::string shell_word(const std::string& w) {
  const bool bare = !w.empty() && std::all_of(w.begin(), w.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || (ch && std::strchr("_-./=:,+@%", ch));
  });
  if (bare) return w;
  std::string out = "'";
  for (char ch : w) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

// A Megatron-LM launch script's arguments are a few KiB.
std::string read_args_file(const std::string& path) {
  constexpr uint64_t kMaxArgsBytes = uint64_t(1) << 20;
  return io::read_input_file(path, kMaxArgsBytes, "--args-file " + path, "an arguments file");
}

int run_plan_import(Args& a) {
  const bool json = a.flag("--json");
  const std::string from = a.required("--from");
  auto args_file = a.value("--args-file");
  auto out = a.output("-o");
  auto model_out = a.output("--model-out");
  ClusterSpec c = cluster_from_args(a);
  // What the user gave here wins over the job's launcher flags (megatron_job_from_args).
  const interop::JobSize user_size{a.int_value("--nodes", 1, limits::kMaxNodes),
                                   a.int_value("--gpus-per-node", 1, limits::kMaxNodes)};
  // A Megatron-LM job runs on Megatron-Core: priced so unless the user asks otherwise.
  const FrameworkSpec fw = framework_from_args(a, "megatron-core");
  std::vector<std::string> tokens = a.take_passthrough();
  const std::vector<std::string> after_dashes = tokens;
  a.finish();
  if (from != "megatron")
    throw InputError(a.command() + ": --from: unknown source '" + shorten(from) +
                     "' (expected megatron)");
  if (!args_file && tokens.empty())
    throw InputError(a.command() + ": give --args-file FILE or the Megatron-LM arguments after --");
  // The arguments after -- follow the file's, as if appended to its command line: a flag given
  // in both takes the value after -- (the last, as argparse).
  const std::string source =
      args_file ? *args_file + (tokens.empty() ? "" : " and the arguments after --")
                : std::string("the arguments after --");
  if (args_file) {
    std::vector<std::string> file_tokens =
        interop::split_command_line(read_args_file(*args_file), *args_file);
    file_tokens.insert(file_tokens.end(), tokens.begin(), tokens.end());
    tokens = std::move(file_tokens);
  }
  const interop::MegatronJob job = interop::megatron_job_from_args(tokens, c, source, user_size);
  if (world_rank() == 0) {
    if (out) io::write_output("-o", *out, to_json(job.plan).dump(2) + "\n");
    if (model_out) io::write_output("--model-out", *model_out, to_json(job.model).dump(2) + "\n");
  }
  const CostModel cost(job.model, c, job.plan.dtype, fw);
  const Estimate e = estimate(cost, job.plan);
  if (json) {
    nlohmann::json j;
    j["model"] = to_json(job.model);
    j["plan"] = to_json(job.plan);
    j["cluster"] = c.name;
    j["nodes"] = c.nodes;
    j["gpus_per_node"] = c.node.gpus_per_node;
    j["ignored_flags"] = job.ignored_flags;
    j["notes"] = job.notes;
    j["estimate"] = to_json(e);
    j["hbm_bytes"] = c.gpu.hbm_bytes;
    j["fits"] = fits_gpu_memory(e, c);
    print_json(j);
    return 0;
  }
  if (world_rank() != 0) return 0;
  std::printf(
      "Megatron-LM job: %s (%d layers, hidden %d, %d heads, %d kv, ffn %d, vocab %d, "
      "seq %d) on %s x %d nodes x %d GPUs\n  %s\n",
      job.model.name.c_str(), job.model.layers, job.model.hidden, job.model.heads,
      job.model.kv_heads, job.model.ffn_hidden, job.model.vocab, job.model.seq_len, c.name.c_str(),
      c.nodes, c.node.gpus_per_node, job.plan.describe().c_str());
  std::printf(
      "forecast (estimate, framework %s): iteration %.4g s, %.4g tokens/s, MFU %.1f%%, "
      "peak memory %.2f GiB per GPU\n",
      fw.name.c_str(), e.iteration_time_s, e.tokens_per_s, 100 * e.mfu,
      double(e.peak_memory_bytes) / double(1LL << 30));
  if (!fits_gpu_memory(e, c))
    std::printf(
        "  warning: the forecast peak, %.2f GiB per GPU, DOES NOT FIT in the %.2f GiB of "
        "a %s GPU\n",
        double(e.peak_memory_bytes) / double(1LL << 30),
        double(c.gpu.hbm_bytes) / double(1LL << 30), c.name.c_str());
  for (const auto& n : job.notes) std::printf("  note: %s\n", n.c_str());
  if (!job.ignored_flags.empty()) {
    std::string list;
    for (const auto& f : job.ignored_flags) list += " " + f;
    std::printf("  not about the model or the plan (not read):%s\n", list.c_str());
  }
  if (out) std::printf("wrote %s\n", out->c_str());
  if (model_out) std::printf("wrote %s\n", model_out->c_str());
  // A line to paste: without --model-out, this import again writing the model first.
  const std::string where = " --cluster " + shell_word(c.name) + " --nodes " +
                            std::to_string(c.nodes) + " --gpus-per-node " +
                            std::to_string(c.node.gpus_per_node);
  std::string model_file = model_out ? *model_out : job.model.name + ".model.json", first;
  if (!model_out) {
    first = "stratagem plan import --from megatron" +
            (args_file ? " --args-file " + shell_word(*args_file) : std::string()) + where +
            " --model-out " + shell_word(model_file);
    if (!after_dashes.empty()) first += " --";
    for (const auto& t : after_dashes) first += " " + shell_word(t);
    first += " >/dev/null && ";
  }
  std::printf(
      "what stratagem would run instead: %sstratagem search --model %s%s --global-batch %d\n",
      first.c_str(), shell_word(model_file).c_str(), where.c_str(), job.plan.global_batch);
  return 0;
}

Register reg_import{
    {"plan import", "read a Megatron-LM job's model and parallel flags into a model and a plan",
     std::string("usage: stratagem plan import --from megatron [--args-file FILE] [-- ARGS...]\n"
                 "           [--cluster C] [--nodes N] [--gpus-per-node N] [-o plan.json]\n"
                 "           [--model-out model.json] [--framework F] [--json]\n"
                 "  The job is priced as Megatron-Core runs it (--framework megatron-core)\n"
                 "  unless --framework says otherwise.\n"
                 "  FILE holds a pretrain_gpt.py command line (shell quoting, # comments and\n"
                 "  backslash continuations allowed); ARGS after -- follow the file's (a flag\n"
                 "  in both takes the value after --, as argparse). torchrun's --nnodes and\n"
                 "  --nproc-per-node before the script set the job's size where --nodes and\n"
                 "  --gpus-per-node are not given (given, they win, and a note says so).\n"
                 "  Prints the forecast of the job as it runs today.\n") +
         kClusterHelp + kFrameworkHelp,
     run_plan_import}};

}  // namespace
}  // namespace stratagem::cli
