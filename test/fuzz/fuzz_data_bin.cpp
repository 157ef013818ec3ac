// llm.c .bin token files (and anything else `train --data` may be given): load, check against
// a small model, and sample a batch.
#include <cstdint>
#include <vector>

#include "stratagem/data.hpp"
#include "stratagem/error.hpp"
#include "test/fuzz/harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stratagem;
  const std::string path = fuzz::write_input(data, size, ".bin");
  fuzz::expect_input_errors([&] {
    const TokenDataset d = TokenDataset::load(path);
    d.check_fits(8, 65536);
    std::vector<int32_t> tokens(8), targets(8);
    for (int64_t i = 0; i < 4; ++i) d.sample(1234, 0, i, 8, tokens.data(), targets.data());
  });
  return 0;
}
