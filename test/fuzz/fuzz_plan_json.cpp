// Plan JSON against a fixed model and cluster (GPT-2 124M on two DGX A100 nodes): parse,
// validate, and price the valid ones with the estimator, as `stratagem estimate --plan` does.
#include <string>

#include "stratagem/cost.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/plan.hpp"
#include "stratagem/spec_json.hpp"
#include "test/fuzz/harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stratagem;
  static const ModelSpec model = load_model("gpt2-124m");
  static const ClusterSpec cluster = [] {
    ClusterSpec c = load_cluster("dgx-a100-80g");
    c.nodes = 2;
    return c;
  }();
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_input_errors([&] {
    const Plan p = plan_from_json(io::parse_json(text, "plan.json"), model, "plan.json");
    validate(p, model, cluster, "plan.json");
    CostModel cost(model, cluster, p.dtype);
    volatile double sink = estimate(cost, p).iteration_time_s;
    (void)sink;
  });
  return 0;
}
