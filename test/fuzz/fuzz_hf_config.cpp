// Hugging Face config.json: parse, import (every architecture's fields and defaults), the notes
// on what the import approximates, and the sizes the tools print.
#include <string>

#include "stratagem/interop.hpp"
#include "stratagem/json_reader.hpp"
#include "test/fuzz/harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stratagem;
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_input_errors([&] {
    const auto j = io::parse_json(text, "config.json");
    (void)interop::hf_import_notes(j);
    const ModelSpec m = interop::model_from_hf_config(j, "config.json");
    volatile double sink = double(m.parameters()) + double(m.active_parameters()) +
                           double(m.kv_cache_elements_per_token()) + m.flops_per_token();
    (void)sink;
  });
  return 0;
}
