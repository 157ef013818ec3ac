// Cluster JSON: parse and validate, then derive the figures the cost model uses.
#include <string>

#include "stratagem/cluster.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/spec_json.hpp"
#include "test/fuzz/harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stratagem;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_input_errors([&] {
    const ClusterSpec c = cluster_from_json(io::parse_json(text, "cluster.json"), "cluster.json");
    volatile double sink = c.internode_gbps_per_gpu() + c.world_size();
    (void)sink;
  });
  return 0;
}
