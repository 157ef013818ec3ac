// HDF5 traces as `trace info`, `trace export` and `compare` read them: ranks, every rank's ops
// and memory samples, and the integer attributes. Not the string attributes (nor the Chrome
// export, which reads them): libhdf5 1.10.8 loops on a damaged global heap while reading a
// variable-length string (known-hdf5/trace-hang-in-H5HG_read); the reader's child process is
// killed at the bound then (8 s in the campaign), which would make such inputs, frequent among
// mutations, cost the campaign most of its time.
//
// A trace written with a digest in its user block (src/io/file_digest.hpp) is checked against
// it before libhdf5 opens it; one without (written before digests) is read in child processes
// (stratagem/hdf5_guard.hpp), as the product reads it. So that
// mutations of a trace with a digest still reach the HDF5 parsing behind that check, such an
// input is run twice: as it is, then resealed (its digest rewritten for its bytes).
#include <cstring>
#include <string>

#include "src/io/file_digest.hpp"
#include "stratagem/error.hpp"
#include "stratagem/trace.hpp"
#include "test/fuzz/harness.hpp"

namespace {
void read_trace(const std::string& path) {
  using namespace stratagem;
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
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stratagem;
  constexpr size_t kBlockBytes = 4096;  // as trace::Writer reserves
  const std::string path = fuzz::write_input(data, size, ".h5");
  read_trace(path);
  if (size >= kBlockBytes && std::memcmp(data, "STRATAGEM-DIGEST", 16) == 0) {
    io::seal_file_digest(MPI_COMM_NULL, path, kBlockBytes, 0, /*durable=*/false);
    read_trace(path);
  }
  return 0;
}
