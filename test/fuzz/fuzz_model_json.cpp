// Model JSON: parse, validate, and derive every size the tools print (parameters, FLOPs).
#include <string>

#include "stratagem/json_reader.hpp"
#include "stratagem/model.hpp"
#include "stratagem/spec_json.hpp"
#include "test/fuzz/harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stratagem;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_input_errors([&] {
    const ModelSpec m = model_from_json(io::parse_json(text, "model.json"), "model.json");
    volatile double sink = double(m.parameters()) + double(m.active_parameters()) +
                           double(m.kv_cache_elements_per_token()) + m.flops_per_token();
    (void)sink;
  });
  return 0;
}
