#include <climits>
#include <cstdio>

#include "src/cli/command.hpp"
#include "src/cli/memory_check.hpp"
#include "src/cli/model_support.hpp"
#include "stratagem/layout.hpp"
#include "stratagem/program.hpp"

namespace stratagem::cli {
namespace {

int run_program_dump(Args& a) {
  const bool json = a.flag("--json");
  const int rank = a.int_value("--rank").value_or(0);
  // Without --limit (-1), every op.
  const int limit = a.int_value("--limit", 1, INT_MAX).value_or(-1);
  ModelSpec m = model_from_args(a);
  require_supported_model(m, a.command(), ModelUse::forecast);
  ClusterSpec c = cluster_from_args(a);
  Plan p = plan_from_args(a, m, c);
  const FrameworkSpec fw = framework_from_args(a);
  a.finish();
  // Before they exist: the Layout grows with the ranks, the Program with the micro-batches.
  check_layout_memory(p, c, local_size(), a.command());
  check_program_memory(m, p, local_size(), a.command());
  Layout L(p, c);
  if (rank < 0 || rank >= L.world_size())
    throw InputError(a.command() + ": --rank " + std::to_string(rank) +
                     " is outside the world of " + std::to_string(L.world_size()) + " ranks");
  Program prog = build_program(m, p, fw);
  const StageProgram& sp = prog.stages[L.coords(rank).stage];
  const int n = limit < 0 ? (int)sp.ops.size() : std::min<int>(limit, sp.ops.size());
  if (world_rank() != 0) return 0;
  if (json) {
    nlohmann::json ops = nlohmann::json::array();
    for (int i = 0; i < n; ++i) {
      const Op& op = sp.ops[i];
      nlohmann::json o = {{"index", i},
                          {"name", op_name(op)},
                          {"kind", to_string(op.kind)},
                          {"stream", to_string(op.stream)},
                          {"layer", op.layer},
                          {"microbatch", op.microbatch},
                          {"bytes", op.bytes},
                          {"flops", op.flops}};
      int g = resolve_group(L, rank, op);
      if (g >= 0) o["group_ranks"] = L.group(g).ranks;
      int peer = resolve_peer(L, rank, op);
      if (op.kind == OpKind::send || op.kind == OpKind::recv) o["peer"] = peer;
      o["deps"] = std::vector<uint32_t>(sp.deps_of(op), sp.deps_of(op) + op.dep_count);
      ops.push_back(o);
    }
    print_json({{"rank", rank},
                {"stage", L.coords(rank).stage},
                {"num_ops", sp.ops.size()},
                {"ops", ops}});
    return 0;
  }
  std::printf("rank %d (stage %d, local %d, node %d, gpu %d): %zu ops\n", rank,
              L.coords(rank).stage, L.coords(rank).local, L.coords(rank).node,
              L.coords(rank).local_gpu, sp.ops.size());
  for (int i = 0; i < n; ++i) {
    const Op& op = sp.ops[i];
    std::printf("%6d %-8s %-34s", i, to_string(op.stream), op_name(op).c_str());
    if (op.bytes) std::printf(" bytes=%lld", (long long)op.bytes);
    if (op.flops > 0) std::printf(" flops=%.4g", op.flops);
    int g = resolve_group(L, rank, op);
    if (g >= 0) {
      const auto& grp = L.group(g);
      std::printf(" group=%s[%d..%d]x%zu", to_string(grp.kind), grp.ranks.front(), grp.ranks.back(),
                  grp.ranks.size());
    }
    if (op.kind == OpKind::send || op.kind == OpKind::recv)
      std::printf(" peer=%d", resolve_peer(L, rank, op));
    if (op.dep_count) {
      std::printf(" after=");
      for (uint32_t d = 0; d < op.dep_count; ++d)
        std::printf("%s%u", d ? "," : "", sp.deps_of(op)[d]);
    }
    std::printf("\n");
  }
  return 0;
}

Register reg{{"program dump", "print one rank's instruction stream for an iteration",
              std::string("usage: stratagem program dump --model M --cluster C --nodes N "
                          "(--plan FILE | shorthand flags) [--framework F] [--rank R] [--limit N] "
                          "[--json]\n") +
                  kModelHelp + kClusterHelp + kFrameworkHelp + kPlanHelp,
              run_program_dump}};

}  // namespace
}  // namespace stratagem::cli
