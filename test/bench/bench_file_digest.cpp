// `make bench`: what the digest adds to writing and to resuming from a checkpoint. A 1 GiB file
// (in $TMPDIR, page-cached after the first pass) is read through once, sealed and verified, on
// one rank; each is printed in GB/s with its ratio to the plain read. (With more ranks, each
// hashes 1/world of the chunks: mpirun -np N build/bench_file_digest divides the work.)
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "src/io/file_digest.hpp"

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  constexpr uint64_t kBlock = 4096, kBytes = uint64_t(1) << 30;
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/stratagem-bench-digest.bin";
  MPI_Bcast(path.data(), int(path.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) {  // user block of zeros, then pseudo-random bytes
    FILE* f = std::fopen(path.c_str(), "wb");
    std::vector<uint64_t> buf(1 << 20);
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    std::fwrite(std::vector<char>(kBlock, 0).data(), 1, kBlock, f);
    for (uint64_t done = 0; done < kBytes; done += buf.size() * 8) {
      for (auto& v : buf) x ^= x << 13, x ^= x >> 7, x ^= x << 17, v = x;
      std::fwrite(buf.data(), 8, buf.size(), f);
    }
    std::fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  double read_s = 1e30, seal_s = 1e30, verify_s = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    // Each rank reads its share of the chunks, as seal and verify do.
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = std::chrono::steady_clock::now();
    {
      const int fd = ::open(path.c_str(), O_RDONLY);
      std::vector<char> buf(size_t(4) << 20);
      volatile char sink = 0;
      const uint64_t chunk = stratagem::io::kDigestChunkBytes;
      for (uint64_t c = uint64_t(rank); c * chunk < kBytes; c += uint64_t(world))
        for (uint64_t at = c * chunk; at < std::min(kBytes, (c + 1) * chunk); at += buf.size())
          if (::pread(fd, buf.data(), buf.size(), off_t(kBlock + at)) > 0) sink = sink + buf[0];
      ::close(fd);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    read_s = std::min(read_s, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    stratagem::io::seal_file_digest(MPI_COMM_WORLD, path, kBlock);
    seal_s = std::min(seal_s, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    const auto v = stratagem::io::verify_file_digest(MPI_COMM_WORLD, path);
    verify_s = std::min(verify_s, seconds_since(t0));
    if (v.kind != stratagem::io::DigestVerdict::intact) {
      std::fprintf(stderr, "bench_file_digest: %s\n", v.why.c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  if (rank == 0) {
    const double gb = double(kBytes) / 1e9;
    std::printf("file digest, 1 GiB page-cached, %d rank%s (best of 3):\n", world,
                world > 1 ? "s" : "");
    std::printf("  read    %6.2f GB/s\n", gb / read_s);
    std::printf("  seal    %6.2f GB/s  (%.2fx the read's time)\n", gb / seal_s, seal_s / read_s);
    std::printf("  verify  %6.2f GB/s  (%.2fx the read's time)\n", gb / verify_s,
                verify_s / read_s);
    std::remove(path.c_str());
  }
  MPI_Finalize();
  return 0;
}
