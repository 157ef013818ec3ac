// Framework JSON (data/frameworks, --framework FILE.json): parse and validate, then price a
// fixed plan under it with the estimator, as `stratagem estimate --framework` does (GPT-2 124M,
// dp 8 under ZeRO-2 on one DGX A100 node, where every framework field enters the cost).
#include <string>

#include "src/cli/args.hpp"
#include "stratagem/cost.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/framework.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/spec_json.hpp"
#include "test/fuzz/harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stratagem;
  static const ModelSpec model = load_model("gpt2-124m");
  static const ClusterSpec cluster = load_cluster("dgx-a100-80g");
  static const Plan plan = [] {
    cli::Args a("stratagem estimate",
                {"--dp", "8", "--zero", "2", "--micro-batch", "2", "--global-batch", "32"});
    return cli::plan_from_args(a, model, cluster);
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_input_errors([&] {
    const FrameworkSpec f =
        framework_from_json(io::parse_json(text, "framework.json"), "framework.json");
    CostModel cost(model, cluster, plan.dtype, f);
    volatile double sink = estimate(cost, plan).iteration_time_s;
    (void)sink;
  });
  return 0;
}
