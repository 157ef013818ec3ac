// A digest of a file's bytes, kept in the file's own HDF5 user block, so that a damaged
// checkpoint or trace is refused before libhdf5 parses it (libhdf5 1.10.8 crashes on some
// damaged files: test/fuzz/known-hdf5/). The file stays a plain HDF5 file (h5py, h5dump skip
// the user block), and the digest is published with it by the same rename.
//
// Layout of the user block (little-endian), written after the file is closed:
//   0   "STRATAGEM-DIGEST"  16 bytes
//   16  u64 version (1)
//   24  u64 block_bytes     the user block's size (where the HDF5 superblock starts)
//   32  u64 file_bytes      the whole file's size
//   40  u64 chunk_bytes     the bytes after the user block are hashed in chunks of this size
//   48  u64 chunk_count
//   56  u64 header_hash     XXH64 of bytes [0, 56) and of the chunk hashes
//   64  u64 chunk_hash[chunk_count]  XXH64 of chunk i, seeded with i
//   ..  zeros up to block_bytes (checked too: no byte of the file goes unchecked)
// Chunks are hashed by the ranks in parallel (chunk i by rank i mod world), when sealing and
// when verifying; one rank reads only the header.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace stratagem::io {

// XXH64 (xxHash's 64-bit hash, streaming), as specified in xxHash's doc/xxhash_spec.md.
class Xxh64 {
 public:
  explicit Xxh64(uint64_t seed = 0);
  void update(const void* data, size_t bytes);
  uint64_t digest() const;

 private:
  uint64_t acc_[4];
  uint64_t seed_;
  uint64_t total_bytes_ = 0;
  unsigned char pending_[32];
  size_t pending_bytes_ = 0;
};
uint64_t xxh64(const void* data, size_t bytes, uint64_t seed);

constexpr uint64_t kDigestChunkBytes = uint64_t(64) << 20;
constexpr uint64_t kDigestHeaderBytes = 64;

// The user block to reserve (H5Pset_userblock) for a file of about `expected_file_bytes`: room
// for its chunk hashes at kDigestChunkBytes with a margin, at least 4 KiB, a power of two. A
// file that outgrows it is hashed in larger chunks.
uint64_t digest_block_bytes(uint64_t expected_file_bytes);

// Hashes the closed file at `path` (its first `block_bytes` bytes being the user block) and
// writes the digest into the user block, then (`durable`) fsyncs the file. Collective over
// `comm` (MPI_COMM_NULL: this process alone). `chunk_bytes` is a minimum (0:
// kDigestChunkBytes). Throws std::runtime_error naming the file on every rank when any rank
// cannot read it or the digest cannot be written.
void seal_file_digest(MPI_Comm comm, const std::string& path, uint64_t block_bytes,
                      uint64_t chunk_bytes = 0, bool durable = true);

struct DigestVerdict {
  enum Kind { intact, absent, failed } kind = failed;
  std::string why;  // absent, failed: one line, without the path
};
// Collective over `comm` (MPI_COMM_NULL: this process alone); every rank gets the same
// verdict. `absent`: the file starts with an HDF5 superblock, so has no user block (written
// before digests). `failed`: anything else short of intact.
DigestVerdict verify_file_digest(MPI_Comm comm, const std::string& path);

}  // namespace stratagem::io
