#include <cstdio>
#include <string>

#include "src/cli/command.hpp"
#include "stratagem/trace.hpp"

namespace stratagem::cli {
namespace {

std::string one_file(Args& a) {
  auto pos = a.positionals();
  if (pos.size() != 1) throw InputError(a.command() + ": expected one trace file (FILE.h5)");
  return pos[0];
}

int run_export(Args& a) {
  const auto chrome = a.output("--chrome");
  const bool json = a.flag("--json");
  const std::string file = one_file(a);
  a.finish();
  if (!chrome) throw InputError(a.command() + ": give --chrome OUT.json");
  if (world_rank() == 0) trace::export_chrome(file, *chrome);
  if (json)
    print_json({{"input", file}, {"chrome", *chrome}, {"format", "chrome trace-event JSON"}});
  return 0;
}

int run_info(Args& a) {
  const bool json = a.flag("--json");
  const std::string file = one_file(a);
  a.finish();
  if (world_rank() != 0) return 0;
  trace::Reader r(file);
  const auto ranks = r.ranks();
  int64_t ops = 0, end = 0;
  for (int x : ranks)
    for (const auto& o : r.ops(x)) ++ops, end = std::max(end, o.end_ns);
  if (json) {
    print_json({{"source", r.attribute("source")},
                {"tool_version", r.attribute("tool_version")},
                {"ranks", ranks.size()},
                {"ops", ops},
                {"end_ns", end},
                {"iterations", r.int_attribute("iterations")}});
    return 0;
  }
  std::printf("%s: %s trace (stratagem %s), %zu ranks, %lld ops, %.6f s\n", file.c_str(),
              r.attribute("source").c_str(), r.attribute("tool_version").c_str(), ranks.size(),
              (long long)ops, double(end) * 1e-9);
  return 0;
}

Register reg_export{
    {"trace export", "convert an HDF5 trace to Chrome trace-event JSON",
     "usage: stratagem trace export FILE.h5 --chrome OUT.json [--json]\n"
     "  one process per rank (pid = rank), one thread per stream (tid), \"ph\":\"X\"\n"
     "  events with ts/dur in microseconds; open in chrome://tracing or Perfetto\n",
     run_export}};
Register reg_info{{"trace info", "summarize an HDF5 trace (simulated or measured)",
                   "usage: stratagem trace info FILE.h5 [--json]\n", run_info}};

}  // namespace
}  // namespace stratagem::cli
