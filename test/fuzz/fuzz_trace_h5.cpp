// HDF5 traces as `trace info`, `trace export` and `compare` read them: ranks, every rank's ops
// and memory samples, and the integer attributes. Not the string attributes (nor the Chrome
// export, which reads them): libhdf5 1.10.8 loops for minutes on a damaged global heap while
// reading a variable-length string (known-hdf5/trace-hang-in-H5HG_read), a fault inside the
// library that would make every run of this target stop there.
#include <string>

#include "stratagem/error.hpp"
#include "stratagem/trace.hpp"
#include "test/fuzz/harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stratagem;
  const std::string path = fuzz::write_input(data, size, ".h5");
  fuzz::expect_input_errors([&] {
    trace::Reader r(path);
    volatile int64_t sink = r.int_attribute("iterations") + r.int_attribute("world_size");
    int n = 0;
    for (int rank : r.ranks()) {
      if (++n > 64) break;
      for (const auto& op : r.ops(rank)) sink = sink + (op.end_ns - op.start_ns);
      for (const auto& m : r.memory(rank)) sink = sink + m.high_water_bytes;
    }
    (void)sink;
  });
  return 0;
}
