// The command-line parser every subcommand shares: the input is one argument per line, parsed
// as `stratagem estimate` parses its flags (model, overrides, cluster, nodes, plan shorthand),
// and a valid result is priced by the estimator.
#include <string>
#include <vector>

#include "src/cli/args.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/estimate.hpp"
#include "test/fuzz/harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stratagem;
  std::vector<std::string> tokens(1);
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\0') return -1;  // argv strings cannot hold one
    if (data[i] == '\n') {
      if (tokens.size() == 64) return -1;
      tokens.emplace_back();
    } else {
      tokens.back() += char(data[i]);
    }
  }
  // Paths are not this target's subject: keep it off the file system (model and cluster
  // names still resolve to built-ins, and a name with '/' or ".json" is refused up front).
  for (const auto& t : tokens)
    if (t.find('/') != std::string::npos || t.find(".json") != std::string::npos) return -1;
  fuzz::expect_input_errors([&] {
    cli::Args a("stratagem estimate", tokens);
    a.flag("--json");
    const ModelSpec m = cli::model_from_args(a);
    const ClusterSpec c = cli::cluster_from_args(a);
    const Plan p = cli::plan_from_args(a, m, c);
    a.finish();
    CostModel cost(m, c, p.dtype);
    volatile double sink = estimate(cost, p).iteration_time_s;
    (void)sink;
  });
  return 0;
}
