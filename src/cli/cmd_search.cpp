#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "src/cli/command.hpp"
#include "src/cli/memory_check.hpp"
#include "src/cli/model_support.hpp"
#include "stratagem/limits.hpp"
#include "stratagem/output_file.hpp"
#include "stratagem/search.hpp"

namespace stratagem::cli {
namespace {

double gib(int64_t b) {
  return double(b) / double(int64_t(1) << 30);
}

std::string stage_list(const std::vector<int64_t>& v) {
  std::string s;
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    if (i == 6 && v.size() > 8) {
      std::snprintf(buf, sizeof buf, " ..(%zu)", v.size());
      s += buf;
      break;
    }
    std::snprintf(buf, sizeof buf, "%s%.1f", i ? " " : "", gib(v[i]));
    s += buf;
  }
  return s;
}

void print_row(const char* rank, const SearchCandidate& c) {
  std::printf("  %-4s %12.0f %12.0f %9.2f  %-8s %s\n", rank, c.tokens_per_s(), c.est_tokens_per_s,
              gib(c.peak_memory_bytes()), c.origin.c_str(), c.plan.describe().c_str());
  std::printf("       %12s %12s %9s  per-stage peak GiB: %s%s\n", "", "", "",
              stage_list(c.stage_peak_bytes()).c_str(),
              c.simulated && !c.sim_fits
                  ? "  (simulated: over the budget or deadlocked; ranked last)"
                  : "");
}

// --cp-degrees: a comma list of context-parallel degrees; "1" alone: none beside cp 1. An
// empty item ('', '2,') is refused, not skipped.
std::vector<int> cp_degree_list(const std::string& list, const std::string& command) {
  std::vector<int> out;
  for (size_t at = 0;;) {
    const size_t comma = list.find(',', at);
    const std::string item = list.substr(at, comma == std::string::npos ? comma : comma - at);
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE || v < 1 || v > limits::kMaxTp)
      throw InputError(command + ": flag --cp-degrees: expected a comma list of degrees in [1, " +
                       std::to_string(limits::kMaxTp) + "], got '" + shorten(list) + "'");
    out.push_back(int(v));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

// A degree the search cannot use would be dropped without a word: refused by name instead.
void check_cp_degrees(const std::vector<int>& degrees, const ModelSpec& m, const ClusterSpec& c,
                      const std::string& command) {
  for (int cp : degrees) {
    if (cp == 1) continue;
    const std::string bad = command + ": flag --cp-degrees: cp " + std::to_string(cp) + " ";
    if (m.attention == AttentionKind::mla)
      throw InputError(bad + "splits MLA attention, which context parallelism does not support");
    if (c.world_size() % cp)
      throw InputError(bad + "does not divide the " + std::to_string(c.world_size()) +
                       " GPUs of --cluster/--nodes");
    if (m.seq_len % cp)
      throw InputError(bad + "does not divide the model's seq_len " + std::to_string(m.seq_len));
  }
}

// The search's own flags (the space, the budget, the scorer).
SearchOptions search_options(Args& a) {
  SearchOptions o;
  if (auto s = a.value("--space")) o.space = search_space_from_string(*s, "--space");
  if (auto k = a.int_value("--top")) o.top_k = *k;
  if (auto t = a.int_value("--threads")) {
    if (*t < 1 || *t > 1024)
      throw InputError(a.command() + ": --threads: expected 1..1024, got " + std::to_string(*t));
    o.threads = *t;
  }
  // Below 1 MiB a budget would round to "not set" (0 bytes) in the search's buckets.
  if (auto b = a.double_in("--memory-budget-gib", 1.0 / 1024, double(1 << 20),
                           "GiB in [0.0009765625 (1 MiB), 1048576]"))
    o.memory_budget_bytes = static_cast<int64_t>(*b * double(int64_t(1) << 30));
  if (auto r = a.value("--rerank")) {
    if (*r == "simulator")
      o.rerank_with_simulator = true;
    else if (*r == "estimator")
      o.rerank_with_simulator = false;
    else
      throw InputError(a.command() + ": --rerank: expected simulator|estimator, got '" + *r + "'");
  }
  if (auto d = a.value("--dtype")) o.dtype = dtype_from_string(*d, "--dtype");
  o.flash_attention = a.flag("--flash-attention");
  o.overlap_grad_reduce = !a.flag("--no-overlap-grad-reduce");
  o.allow_cross_node_tp = a.flag("--allow-cross-node-tp");
  if (auto list = a.value("--cp-degrees")) o.cp_degrees = cp_degree_list(*list, a.command());
  return o;
}

// No plan fits the budget: the line, and with --json the smallest plan's peak.
int report_no_plan(const NoFeasiblePlan& e, const std::string& cmd, bool json) {
  if (world_rank() == 0) {
    std::fprintf(stderr, "%s: error: %s\n", cmd.c_str(), e.what());
    if (json) {
      nlohmann::json j = {{"feasible", false},
                          {"error", e.what()},
                          {"memory_budget_bytes", e.budget_bytes},
                          {"smallest_peak_memory_bytes", nullptr},
                          {"smallest_peak_plan", nullptr}};
      if (e.smallest) {
        j["smallest_peak_memory_bytes"] = e.smallest->est_peak_memory_bytes;
        j["smallest_peak_plan"] = to_json(e.smallest->plan);
      }
      print_json(j);
    }
  }
  return kExitNoFeasiblePlan;
}

// The ranked table, the best plan and the baselines (rank 0, without --json).
void print_result(const SearchResult& r, const ModelSpec& m, const ClusterSpec& c,
                  const SearchOptions& o) {
  std::printf(
      "search: %s on %s x %d nodes (%d GPUs), framework %s, global batch %d, budget %.2f GiB per "
      "GPU, space %s\n",
      m.name.c_str(), c.name.c_str(), c.nodes, c.world_size(), o.framework.name.c_str(),
      o.global_batch, gib(r.memory_budget_bytes), to_string(r.space));
  if (r.scorer == "simulator")
    std::printf(
        "every plan scored by the estimator; the top %d (and each baseline's) re-ranked by the "
        "simulator\n",
        o.top_k);
  else
    std::printf("ranked by the estimator alone: %s\n", r.scorer_note.c_str());
  const SearchCandidate& b = r.best;
  std::printf(
      "best: %.0f tokens/s, iteration %.4f s, peak %.2f GiB per GPU\n  %s\n  embedding and LM "
      "head: %s\n",
      b.tokens_per_s(), b.iteration_time_s(), gib(b.peak_memory_bytes()), b.plan.describe().c_str(),
      b.plan.embedding.describe().c_str());
  std::printf("\ntop candidates (tokens/s by the %s; est = estimator):\n", r.scorer.c_str());
  std::printf("  %-4s %12s %12s %9s  %-8s %s\n", "#", "tokens/s", "est tok/s", "peak GiB", "origin",
              "plan");
  for (size_t i = 0; i < r.ranked.size(); ++i)
    print_row(std::to_string(i + 1).c_str(), r.ranked[i]);
  std::printf("\nbaselines (same scorer):\n");
  auto baseline = [&](const char* name, const std::optional<SearchCandidate>& c,
                      const std::string& note) {
    if (!c) {
      std::printf("  %-9s none: %s\n", name, note.c_str());
      return;
    }
    std::printf("  %-9s %.0f tokens/s (best is %.2fx), peak %.2f GiB: %s\n", name,
                c->tokens_per_s(),
                c->tokens_per_s() > 0 ? b.tokens_per_s() / c->tokens_per_s() : 0.0,
                gib(c->peak_memory_bytes()), c->plan.describe().c_str());
  };
  baseline("megatron", r.megatron, r.megatron_note);
  baseline("zero-3", r.zero, r.zero_note);
  const SearchStats& s = r.stats;
  std::printf(
      "\n%lld candidate plans evaluated, %lld simulated; %lld of %lld configurations searched "
      "(%lld pruned by the bound, %lld cannot fit); %.2f s (%.2f s estimate phase, %.2f s "
      "re-rank) on %d process%s\n",
      (long long)s.candidates_evaluated, (long long)s.plans_simulated,
      (long long)s.configs_searched, (long long)s.configs, (long long)s.configs_pruned,
      (long long)s.configs_unfit, s.search_time_s, s.estimate_phase_s, s.rerank_phase_s,
      s.processes, s.processes > 1 ? "es" : "");
}

int run_search(Args& a) {
  const bool json = a.flag("--json");
  const auto out = a.output("-o");
  SearchOptions o = search_options(a);
  const bool quiet = a.flag("--quiet");
  auto gb = a.int_value("--global-batch");
  ModelSpec m = model_from_args(a);
  require_supported_model(m, a.command(), ModelUse::forecast);
  ClusterSpec c = cluster_from_args(a);
  o.framework = framework_from_args(a);
  a.finish();
  check_cp_degrees(o.cp_degrees, m, c, a.command());
  if (!gb) throw InputError(a.command() + ": missing required flag --global-batch");
  o.global_batch = *gb;
  if (o.top_k < 1 || o.top_k > 1000)
    throw InputError(a.command() + ": --top: expected 1..1000, got " + std::to_string(o.top_k));
  if (world_size() > 1) o.comm = MPI_COMM_WORLD;
  // The DPs run on as many threads as the re-rank: --threads, else the node's cores shared by
  // its processes (Searcher::rerank_threads).
  const int cores = int(std::max(1u, std::thread::hardware_concurrency()));
  check_search_dp_memory(m, c, o, o.threads > 0 ? o.threads : std::max(1, cores / local_size()),
                         local_size(), a.command());
  if (o.rerank_with_simulator) {
    // As many simulations at once as the re-rank runs threads (rerank.cpp), at most its set.
    const int threads =
        std::min(o.threads > 0 ? o.threads : std::max(1, cores / local_size()), 3 * o.top_k);
    check_search_memory(m, c, o.global_batch, threads, local_size(), a.command());
  }
  if (!quiet && world_rank() == 0)
    o.progress = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };

  SearchResult r;
  try {
    r = search(m, c, o);
  } catch (const NoFeasiblePlan& e) {
    return report_no_plan(e, a.command(), json);
  }
  if (world_rank() == 0 && out) io::write_output("-o", *out, to_json(r.best.plan).dump(2) + "\n");
  if (json) {
    nlohmann::json j = to_json(r);
    j["feasible"] = true;
    j["model"] = m.name;
    j["cluster"] = c.name;
    j["framework"] = o.framework.name;
    j["nodes"] = c.nodes;
    j["global_batch"] = o.global_batch;
    print_json(j);
    return 0;
  }
  if (world_rank() != 0) return 0;
  print_result(r, m, c, o);
  if (out) std::printf("wrote %s\n", out->c_str());
  return 0;
}

Register reg{
    {"search", "search the fastest hybrid-parallel plan under a memory budget",
     std::string("usage: stratagem search --model M --cluster C --nodes N --global-batch B\n"
                 "       [--memory-budget-gib X] [--space full|megatron|zero] [--top K]\n"
                 "       [--threads N]\n"
                 "       [-o plan.json] [--json] [--rerank simulator|estimator] [--dtype D]\n"
                 "       [--flash-attention] [--no-overlap-grad-reduce] [--allow-cross-node-tp]\n"
                 "       [--cp-degrees LIST] [--quiet]\n"
                 "  under mpirun -np P the candidate space is split over the P processes; the\n"
                 "  answer is the same for any P\n") +
         kModelHelp + kClusterHelp + kFrameworkHelp +
         "  --global-batch B         samples per iteration (required)\n"
         "  --memory-budget-gib X    per-GPU budget [the GPU's memory]\n"
         "  --space S                full (per-layer strategies, default), megatron (uniform\n"
         "                           tp/pp/dp, ZeRO <= 1, no offload) or zero (pp 1, tp 1, "
         "ZeRO-3)\n"
         "  --top K                  candidates re-ranked by the simulator and listed [8]\n"
         "  --threads N              threads per process for the DPs and the simulations\n"
         "                           [cores / processes]\n"
         "  -o FILE                  write the best plan (plan JSON, for --plan)\n"
         "  --json                   machine-readable output\n"
         "  --rerank R               simulator (default) or estimator\n"
         "  --dtype D                bf16|fp16|fp32 [bf16]; --flash-attention: flash kernels\n"
         "  --allow-cross-node-tp    also consider tp beyond the GPUs of a node (priced at\n"
         "                           the cross-node cost)\n"
         "  --cp-degrees LIST        context-parallel degrees to try beside 1 (comma list; 1:\n"
         "                           none) [those leaving a rank >= 8192 tokens of a sequence]\n"
         "  --quiet                  no progress lines on stderr\n"
         "exit codes: 0 ok, 2 bad input, 3 no plan fits the memory budget\n",
     run_search}};

}  // namespace
}  // namespace stratagem::cli
