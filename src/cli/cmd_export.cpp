#include <cstdio>

#include "src/cli/command.hpp"
#include "src/cli/model_support.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/interop.hpp"
#include "stratagem/output_file.hpp"
#include "stratagem/spec_json.hpp"

namespace stratagem::cli {
namespace {

// The plan asked for beside the one exported, so that the user sees what --nearest costs.
void print_side_by_side(FILE* to, const ModelSpec& m, const ClusterSpec& c, const FrameworkSpec& fw,
                        const Plan& asked, const Plan& exported) {
  const CostModel cost_a(m, c, asked.dtype, fw), cost_e(m, c, exported.dtype, fw);
  const Estimate a = estimate(cost_a, asked), e = estimate(cost_e, exported);
  const double gib = double(1LL << 30);
  std::fprintf(to, "  plan:     %s\n  exported: %s\n", asked.describe().c_str(),
               exported.describe().c_str());
  std::fprintf(to, "  %-28s %14s %14s\n", "forecast (estimate)", "plan", "exported");
  std::fprintf(to, "  %-28s %14.4g %14.4g\n", "iteration (s)", a.iteration_time_s,
               e.iteration_time_s);
  std::fprintf(to, "  %-28s %14.4g %14.4g\n", "tokens/s", a.tokens_per_s, e.tokens_per_s);
  std::fprintf(to, "  %-28s %13.1f%% %13.1f%%\n", "MFU", 100 * a.mfu, 100 * e.mfu);
  std::fprintf(to, "  %-28s %14.2f %14.2f%s\n", "peak memory per GPU (GiB)",
               double(a.peak_memory_bytes) / gib, double(e.peak_memory_bytes) / gib,
               fits_gpu_memory(e, c) ? "" : "  (exported DOES NOT FIT)");
}

int run_export(Args& a) {
  const interop::Target target = interop::target_from_string(a.required("--to"), "--to");
  const bool nearest = a.flag("--nearest");
  const bool json = a.flag("--json");
  auto out = a.output("-o");
  auto plan_out = a.output("--plan-out");
  ModelSpec m = model_from_args(a);
  require_supported_model(m, a.command(), ModelUse::write);
  ClusterSpec c = cluster_from_args(a);
  Plan p = plan_from_args(a, m, c);
  const FrameworkSpec fw = framework_from_args(a);
  a.finish();
  Plan exported = p;
  const auto missing =
      nearest ? interop::unexpressible(p, m, target) : std::vector<interop::Unexpressible>{};
  if (!missing.empty()) exported = interop::nearest_expressible(p, m, c, target);
  // --nearest never writes a plan that does not fit: memory is given back for time, or exit 3.
  bool refit = false;
  if (nearest) {
    auto fitting = interop::nearest_fitting(exported, m, c, fw, target);
    if (!fitting) {
      if (world_rank() == 0) {
        const Estimate e = estimate(CostModel(m, c, exported.dtype, fw), exported);
        std::fprintf(stderr,
                     "export: error: --nearest: no %s plan near this one fits the memory budget: "
                     "%s needs %.1f GiB per GPU against %.1f GiB, and no ZeRO stage, recompute, "
                     "offload or smaller micro-batch %s can express brings it under\n",
                     interop::to_string(target), exported.describe().c_str(),
                     double(e.peak_memory_bytes) / double(1LL << 30),
                     double(c.gpu.hbm_bytes) / double(1LL << 30), interop::to_string(target));
      }
      return kExitNoFeasiblePlan;
    }
    refit = !(fitting->layers == exported.layers && fitting->embedding == exported.embedding &&
              fitting->micro_batch == exported.micro_batch);
    exported = *fitting;
  }
  const bool changed = !missing.empty() || refit;
  const std::string text = interop::export_plan(exported, m, c, target);
  if (world_rank() != 0) return 0;
  if (plan_out) io::write_output("--plan-out", *plan_out, to_json(exported).dump(2) + "\n");
  if (out) io::write_output("-o", *out, text);
  const std::string ds_flags =
      target == interop::Target::deepspeed
          ? interop::megatron_deepspeed_flags(exported, out ? *out : "ds_config.json")
          : "";
  if (json) {
    nlohmann::json j;
    j["target"] = interop::to_string(target);
    j["file"] = out ? nlohmann::json(*out) : nlohmann::json(nullptr);
    if (!out) j["content"] = text;
    j["plan"] = to_json(exported);
    j["nearest"] = changed;
    j["refit_to_memory"] = refit;
    j["unexpressible"] = nlohmann::json::array();
    for (const auto& u : missing)
      j["unexpressible"].push_back({{"feature", u.feature}, {"where", u.where}});
    if (!ds_flags.empty()) j["megatron_deepspeed_flags"] = ds_flags;
    if (changed) {
      for (const auto& [key, plan] :
           {std::pair<const char*, const Plan*>{"plan", &p}, {"exported", &exported}}) {
        const Estimate e = estimate(CostModel(m, c, plan->dtype, fw), *plan);
        j["forecast"][key] = to_json(e);
        j["forecast"][key]["fits"] = fits_gpu_memory(e, c);
      }
    }
    print_json(j);
    return 0;
  }
  // Notes go to stdout when the export goes to a file, else to stderr beside it.
  FILE* notes = out ? stdout : stderr;
  if (!out) std::fputs(text.c_str(), stdout);
  if (!missing.empty()) {
    std::fprintf(notes, "--nearest: %s cannot express %s (%s)", interop::to_string(target),
                 missing.front().feature.c_str(), missing.front().where.c_str());
    if (missing.size() > 1) std::fprintf(notes, " and %zu more feature(s)", missing.size() - 1);
    std::fprintf(notes, "; exported the nearest plan\n");
  }
  if (refit)
    std::fprintf(notes,
                 "--nearest: the %s plan does not fit in GPU memory; exported the nearest plan "
                 "that does (ZeRO, recompute, offload, micro-batch)\n",
                 missing.empty() ? "asked" : "nearest expressible");
  if (changed) print_side_by_side(notes, m, c, fw, p, exported);
  if (!ds_flags.empty()) std::fprintf(notes, "Megatron-DeepSpeed flags: %s\n", ds_flags.c_str());
  if (out) std::printf("wrote %s (%s)\n", out->c_str(), interop::to_string(target));
  return 0;
}

Register reg{
    {"export", "write a plan as a Megatron-LM, torchtitan or DeepSpeed job description",
     std::string("usage: stratagem export --to megatron|torchtitan|deepspeed --model M "
                 "--cluster C --nodes N (--plan FILE | shorthand flags) [--nearest] "
                 "[-o FILE] [--plan-out plan.json] [--json]\n"
                 "  megatron: pretrain_gpt.py arguments; torchtitan: a TOML job config;\n"
                 "  deepspeed: ds_config.json (and the Megatron-DeepSpeed flags, printed)\n"
                 "  A plan feature the target cannot express exits 2 naming it and the\n"
                 "  layers; --nearest exports the nearest plan it can that fits in GPU memory\n"
                 "  (or exits 3), and prints both forecasts side by side; --plan-out writes the "
                 "plan exported (plan JSON).\n") +
         kModelHelp + kClusterHelp + kFrameworkHelp + kPlanHelp,
     run_export}};

}  // namespace
}  // namespace stratagem::cli
