#include "src/io/file_digest.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "stratagem/blocking_section.hpp"

namespace stratagem::io {

namespace {
constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL, kP2 = 0xC2B2AE3D27D4EB4FULL,
                   kP3 = 0x165667B19E3779F9ULL, kP4 = 0x85EBCA77C2B2AE63ULL,
                   kP5 = 0x27D4EB2F165667C5ULL;
uint64_t rotl(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}
// Little-endian loads, whatever the host's order.
uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}
uint32_t load32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}
void store64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint64_t round64(uint64_t acc, uint64_t lane) {
  acc += lane * kP2;
  return rotl(acc, 31) * kP1;
}
uint64_t merge64(uint64_t h, uint64_t acc) {
  h ^= round64(0, acc);
  return h * kP1 + kP4;
}
}  // namespace

Xxh64::Xxh64(uint64_t seed) : seed_(seed) {
  acc_[0] = seed + kP1 + kP2;
  acc_[1] = seed + kP2;
  acc_[2] = seed;
  acc_[3] = seed - kP1;
}

void Xxh64::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_bytes_ += bytes;
  if (pending_bytes_ > 0) {
    const size_t take = std::min(bytes, 32 - pending_bytes_);
    std::memcpy(pending_ + pending_bytes_, p, take);
    pending_bytes_ += take, p += take, bytes -= take;
    if (pending_bytes_ < 32) return;
    for (int i = 0; i < 4; ++i) acc_[i] = round64(acc_[i], load64(pending_ + 8 * i));
    pending_bytes_ = 0;
  }
  // (32-byte stripes, 4 lanes)
  for (; bytes >= 32; p += 32, bytes -= 32)
    for (int i = 0; i < 4; ++i) acc_[i] = round64(acc_[i], load64(p + 8 * i));
  std::memcpy(pending_, p, bytes);
  pending_bytes_ = bytes;
}

uint64_t Xxh64::digest() const {
  uint64_t h;
  if (total_bytes_ >= 32) {
    h = rotl(acc_[0], 1) + rotl(acc_[1], 7) + rotl(acc_[2], 12) + rotl(acc_[3], 18);
    for (int i = 0; i < 4; ++i) h = merge64(h, acc_[i]);
  } else {
    h = seed_ + kP5;
  }
  h += total_bytes_;
  const unsigned char* p = pending_;
  size_t n = pending_bytes_;
  for (; n >= 8; p += 8, n -= 8) h = rotl(h ^ round64(0, load64(p)), 27) * kP1 + kP4;
  if (n >= 4) h = rotl(h ^ (uint64_t(load32(p)) * kP1), 23) * kP2 + kP3, p += 4, n -= 4;
  for (; n > 0; ++p, --n) h = rotl(h ^ (uint64_t(*p) * kP5), 11) * kP1;
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  return h ^ (h >> 32);
}

uint64_t xxh64(const void* data, size_t bytes, uint64_t seed) {
  Xxh64 h(seed);
  h.update(data, bytes);
  return h.digest();
}

namespace {
constexpr char kMagic[16] = {'S', 'T', 'R', 'A', 'T', 'A', 'G', 'E',
                             'M', '-', 'D', 'I', 'G', 'E', 'S', 'T'};
constexpr unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
constexpr uint64_t kVersion = 1;
constexpr uint64_t kMaxBlockBytes = uint64_t(1) << 30;
constexpr uint64_t kMaxChunkBytes = uint64_t(1) << 40;
constexpr size_t kReadBytes = size_t(4) << 20;

struct Comm {
  MPI_Comm comm;
  int rank = 0, size = 1;
  explicit Comm(MPI_Comm c) : comm(c) {
    if (c != MPI_COMM_NULL) MPI_Comm_rank(c, &rank), MPI_Comm_size(c, &size);
  }
  bool parallel() const { return comm != MPI_COMM_NULL; }
};

uint64_t chunk_count(uint64_t file_bytes, uint64_t block_bytes, uint64_t chunk_bytes) {
  return (file_bytes - block_bytes + chunk_bytes - 1) / chunk_bytes;
}

// Opens a file for reading, retrying on EINTR; -1 on failure (errno set).
int open_read(const std::string& path) {
  int fd;
  do fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  return fd;
}
// Reads exactly `bytes` at `offset`; false on an error or a short file.
bool read_at(int fd, void* out, size_t bytes, uint64_t offset) {
  auto* p = static_cast<unsigned char*>(out);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, bytes, off_t(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n, bytes -= size_t(n), offset += uint64_t(n);
  }
  return true;
}
// XXH64 of bytes [offset, offset + bytes), seeded with the chunk's index.
bool hash_range(int fd, uint64_t offset, uint64_t bytes, uint64_t seed,
                std::vector<unsigned char>& buf, uint64_t* out) {
  Xxh64 h(seed);
  while (bytes > 0) {
    const size_t n = size_t(std::min<uint64_t>(bytes, buf.size()));
    if (!read_at(fd, buf.data(), n, offset)) return false;
    h.update(buf.data(), n);
    offset += n, bytes -= n;
  }
  *out = h.digest();
  return true;
}

// Chunk i of the file: [block + i * chunk, min(file, block + (i + 1) * chunk)).
struct Chunks {
  uint64_t file_bytes = 0, block_bytes = 0, chunk_bytes = 1, count = 0;
  uint64_t begin(uint64_t i) const { return block_bytes + i * chunk_bytes; }
  uint64_t end(uint64_t i) const { return std::min(file_bytes, begin(i) + chunk_bytes); }
};

// No larger than the file's hashed bytes (a small file is not read through 4 MiB).
size_t read_buffer_bytes(const Chunks& k) {
  return size_t(
      std::max<uint64_t>(1, std::min({kReadBytes, k.chunk_bytes, k.file_bytes - k.block_bytes})));
}

uint64_t header_hash(const unsigned char* head, const unsigned char* hashes, uint64_t count) {
  Xxh64 h(0);
  h.update(head, 56);
  h.update(hashes, size_t(count) * 8);
  return h.digest();
}

std::string bytes_text(uint64_t b) {
  return std::to_string(b) + " bytes";
}
}  // namespace

uint64_t digest_block_bytes(uint64_t expected_file_bytes) {
  // Room for twice the expected chunks, and 16 more (metadata outgrowing the estimate).
  const uint64_t chunks = 2 * (expected_file_bytes / kDigestChunkBytes + 1) + 16;
  uint64_t block = 4096;
  while (block < kMaxBlockBytes && block < kDigestHeaderBytes + 8 * chunks) block *= 2;
  return block;
}

void seal_file_digest(MPI_Comm comm_in, const std::string& path, uint64_t block_bytes,
                      uint64_t chunk_bytes, bool durable) {
  const Comm c(comm_in);
  if (chunk_bytes == 0) chunk_bytes = kDigestChunkBytes;
  // Rank 0 gives the size (a parallel file system's ranks agree after the close anyway).
  // A file that starts with an HDF5 superblock has no user block: sealing it would destroy it.
  int64_t file_bytes = -1;
  if (c.rank == 0) {
    const int fd = open_read(path);
    struct stat st;
    unsigned char first[8] = {};
    if (fd >= 0 && ::fstat(fd, &st) == 0 &&
        !(read_at(fd, first, 8, 0) && std::memcmp(first, kHdf5Signature, 8) == 0))
      file_bytes = int64_t(st.st_size);
    if (fd >= 0) ::close(fd);
  }
  if (c.parallel()) {
    BlockingSection guard("broadcast of the size of " + path + " (digest)", not_arrived(c.comm));
    MPI_Bcast(&file_bytes, 1, MPI_INT64_T, 0, c.comm);
  }
  if (file_bytes < 0 || uint64_t(file_bytes) < block_bytes || block_bytes < 512 ||
      block_bytes > kMaxBlockBytes || (block_bytes & (block_bytes - 1)) != 0)
    throw std::runtime_error(path + ": cannot write its digest (the file is missing, or has no " +
                             bytes_text(block_bytes) + " user block)");
  Chunks k;
  k.file_bytes = uint64_t(file_bytes), k.block_bytes = block_bytes, k.chunk_bytes = chunk_bytes;
  // A file larger than its user block has room for is hashed in larger chunks.
  const uint64_t room = (block_bytes - kDigestHeaderBytes) / 8;
  while (chunk_count(k.file_bytes, block_bytes, k.chunk_bytes) > room) k.chunk_bytes *= 2;
  k.count = chunk_count(k.file_bytes, block_bytes, k.chunk_bytes);

  std::vector<uint64_t> hashes(k.count, 0);
  int64_t unreadable = 0;
  {
    const int fd = open_read(path);
    std::vector<unsigned char> buf(read_buffer_bytes(k));
    for (uint64_t i = uint64_t(c.rank); i < k.count; i += uint64_t(c.size))
      if (fd < 0 || !hash_range(fd, k.begin(i), k.end(i) - k.begin(i), i, buf, &hashes[i]))
        ++unreadable;
    if (fd >= 0) ::close(fd);
  }
  if (c.parallel()) {
    BlockingSection guard("reduction of the chunk hashes of " + path + " (digest)",
                          not_arrived(c.comm));
    // Each chunk's hash is set by one rank, zero elsewhere.
    MPI_Reduce(c.rank == 0 ? MPI_IN_PLACE : hashes.data(), hashes.data(), int(k.count),
               MPI_UINT64_T, MPI_BOR, 0, c.comm);
    MPI_Allreduce(MPI_IN_PLACE, &unreadable, 1, MPI_INT64_T, MPI_SUM, c.comm);
  }
  int failed = unreadable > 0 ? 1 : 0;
  std::string why = failed ? std::to_string(unreadable) + " chunks could not be read" : "";
  if (c.rank == 0 && !failed) {
    std::vector<unsigned char> head(block_bytes, 0);  // padded with zeros
    std::memcpy(head.data(), kMagic, 16);
    store64(&head[16], kVersion);
    store64(&head[24], block_bytes);
    store64(&head[32], k.file_bytes);
    store64(&head[40], k.chunk_bytes);
    store64(&head[48], k.count);
    for (uint64_t i = 0; i < k.count; ++i) store64(&head[kDigestHeaderBytes + 8 * i], hashes[i]);
    store64(&head[56], header_hash(head.data(), &head[kDigestHeaderBytes], k.count));
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    bool ok = fd >= 0;
    size_t done = 0;
    while (ok && done < head.size()) {
      const ssize_t n = ::pwrite(fd, head.data() + done, head.size() - done, off_t(done));
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      if (ok) done += size_t(n);
    }
    // The digest and the data reach the disk before the rename that publishes them.
    ok = ok && (!durable || ::fsync(fd) == 0);
    if (!ok) failed = 1, why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
  }
  if (c.parallel()) {
    BlockingSection guard("broadcast of the digest status of " + path, not_arrived(c.comm));
    MPI_Bcast(&failed, 1, MPI_INT, 0, c.comm);
  }
  if (failed)
    throw std::runtime_error(path + ": cannot write its digest" +
                             (why.empty() ? std::string() : " (" + why + ")"));
}

namespace {

// What rank 0 reads of a file for its check: the header and the chunk hashes (`head`), the
// file's size, the error that stopped the reading, and the nonzero bytes of the user block's
// padding.
struct DigestRead {
  std::vector<unsigned char> head;
  int64_t file_bytes = -1;
  int64_t error = 0;  // errno
  int64_t nonzero_padding_bytes = 0;
};

// The padding after the chunk hashes up to the end of the user block of `block_bytes`: it must
// be zeros, so that no byte of the file goes unchecked.
void count_nonzero_padding(int fd, uint64_t block_bytes, DigestRead& d) {
  std::vector<unsigned char> pad(size_t(std::min<uint64_t>(kReadBytes, block_bytes)));
  for (uint64_t at = d.head.size();
       d.error == 0 && at < block_bytes && block_bytes <= uint64_t(d.file_bytes);) {
    const size_t n = size_t(std::min<uint64_t>(pad.size(), block_bytes - at));
    if (!read_at(fd, pad.data(), n, at)) d.error = errno ? errno : EIO;
    d.nonzero_padding_bytes +=
        std::count_if(pad.begin(), pad.begin() + n, [](unsigned char x) { return x; });
    at += n;
  }
}

// Rank 0's reading: the header, then the chunk hashes when the header says where they are and
// they fit.
DigestRead read_digest(const std::string& path) {
  DigestRead d;
  const int fd = open_read(path);
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    d.error = errno ? errno : EIO;
  } else {
    d.file_bytes = int64_t(st.st_size);
    d.head.resize(size_t(std::min<int64_t>(d.file_bytes, int64_t(kDigestHeaderBytes))));
    if (!read_at(fd, d.head.data(), d.head.size(), 0)) d.error = errno ? errno : EIO;
    if (d.error == 0 && d.head.size() == kDigestHeaderBytes &&
        std::memcmp(d.head.data(), kMagic, 16) == 0) {
      const uint64_t block = load64(&d.head[24]), count = load64(&d.head[48]);
      if (block <= kMaxBlockBytes && count <= (block - std::min(block, kDigestHeaderBytes)) / 8 &&
          kDigestHeaderBytes + 8 * count <= uint64_t(d.file_bytes)) {
        d.head.resize(size_t(kDigestHeaderBytes + 8 * count));
        if (!read_at(fd, &d.head[kDigestHeaderBytes], size_t(8 * count), kDigestHeaderBytes))
          d.error = errno ? errno : EIO;
        count_nonzero_padding(fd, block, d);
      }
    }
  }
  if (fd >= 0) ::close(fd);
  return d;
}

// Rank 0's reading, on every rank.
void broadcast_digest(const Comm& c, const std::string& path, DigestRead& d) {
  BlockingSection guard("broadcast of the digest of " + path, not_arrived(c.comm));
  int64_t n = int64_t(d.head.size());
  int64_t msg[4] = {d.file_bytes, d.error, d.nonzero_padding_bytes, n};
  MPI_Bcast(msg, 4, MPI_INT64_T, 0, c.comm);
  d.file_bytes = msg[0], d.error = msg[1], d.nonzero_padding_bytes = msg[2];
  d.head.resize(size_t(msg[3]));
  // In pieces of at most INT_MAX bytes (a user block is at most 1 GiB: one piece).
  MPI_Bcast(d.head.data(), int(d.head.size()), MPI_UNSIGNED_CHAR, 0, c.comm);
}

// Judges everything but the chunks: the file could be read, it has a digest of this version, the
// header is consistent and intact, the padding is zeros and the size is the digest's. Fills `k`
// with the digest's chunks; false (with `v` the verdict) at the first fault.
bool check_header(const DigestRead& d, DigestVerdict& v, Chunks& k) {
  const std::vector<unsigned char>& head = d.head;
  if (d.error != 0) {
    v.why = std::string("cannot be read (") + std::strerror(int(d.error)) + ")";
    return false;
  }
  if (head.size() < 16 || std::memcmp(head.data(), kMagic, 16) != 0) {
    if (head.size() >= 8 && std::memcmp(head.data(), kHdf5Signature, 8) == 0) {
      v.kind = DigestVerdict::absent;
      v.why = "no digest (an HDF5 file without a user block: written before digests)";
    } else {
      v.why = "no digest, and no HDF5 superblock at its start (not a stratagem file, or damaged)";
    }
    return false;
  }
  if (head.size() < kDigestHeaderBytes) {
    v.why = "digest cut short (" + bytes_text(head.size()) + " in all)";
    return false;
  }
  const uint64_t version = load64(&head[16]);
  if (version != kVersion) {
    v.why = "digest version " + std::to_string(version) + ", this stratagem reads version " +
            std::to_string(kVersion) + " (or its header is damaged)";
    return false;
  }
  k.file_bytes = load64(&head[32]), k.block_bytes = load64(&head[24]);
  k.chunk_bytes = load64(&head[40]), k.count = load64(&head[48]);
  const uint64_t actual = uint64_t(d.file_bytes);
  if (k.block_bytes < 512 || k.block_bytes > kMaxBlockBytes ||
      (k.block_bytes & (k.block_bytes - 1)) != 0 || k.chunk_bytes == 0 ||
      k.chunk_bytes > kMaxChunkBytes || k.file_bytes < k.block_bytes ||
      head.size() != kDigestHeaderBytes + 8 * k.count ||
      k.count != chunk_count(k.file_bytes, k.block_bytes, k.chunk_bytes)) {
    v.why = "digest damaged (its header is inconsistent)";
    return false;
  }
  if (header_hash(head.data(), &head[kDigestHeaderBytes], k.count) != load64(&head[56])) {
    v.why = "digest damaged (its header fails its own hash)";
    return false;
  }
  if (d.nonzero_padding_bytes > 0) {
    v.why = "digest damaged (" + std::to_string(d.nonzero_padding_bytes) +
            " bytes of its user block's padding are not zero)";
    return false;
  }
  if (actual != k.file_bytes) {
    v.why = bytes_text(actual) + ", its digest says " + bytes_text(k.file_bytes) +
            " (cut short or extended)";
    return false;
  }
  return true;
}

// Hashes the chunks (each rank its share) against the digest's hashes; false (with `v` the
// verdict: how many differ, and where the first one is) when any differs.
bool check_chunks(const Comm& c, const std::string& path, const std::vector<unsigned char>& head,
                  const Chunks& k, DigestVerdict& v) {
  int64_t first_bad = INT64_MAX, bad = 0;
  {
    const int fd = open_read(path);
    std::vector<unsigned char> buf(read_buffer_bytes(k));
    for (uint64_t i = uint64_t(c.rank); i < k.count; i += uint64_t(c.size)) {
      uint64_t h = 0;
      if (fd < 0 || !hash_range(fd, k.begin(i), k.end(i) - k.begin(i), i, buf, &h) ||
          h != load64(&head[kDigestHeaderBytes + 8 * i]))
        first_bad = std::min(first_bad, int64_t(i)), ++bad;
    }
    if (fd >= 0) ::close(fd);
  }
  if (c.parallel()) {
    BlockingSection guard("all-reduce of the digest check of " + path, not_arrived(c.comm));
    MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT64_T, MPI_MIN, c.comm);
    MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT64_T, MPI_SUM, c.comm);
  }
  if (bad > 0) {
    const uint64_t i = uint64_t(first_bad);
    v.why = "fails its digest (damaged): " + std::to_string(bad) + " of " +
            std::to_string(k.count) + " chunks of " + bytes_text(k.chunk_bytes) +
            " differ, the first at bytes [" + std::to_string(k.begin(i)) + ", " +
            std::to_string(k.end(i)) + ")";
    return false;
  }
  return true;
}

}  // namespace

DigestVerdict verify_file_digest(MPI_Comm comm_in, const std::string& path) {
  const Comm c(comm_in);
  // Rank 0 reads the header and the chunk hashes; the others get them by broadcast. Every
  // rank then judges the same bytes the same way.
  DigestRead d;
  if (c.rank == 0) d = read_digest(path);
  if (c.parallel()) broadcast_digest(c, path, d);
  DigestVerdict v;
  v.kind = DigestVerdict::failed;
  Chunks k;
  if (!check_header(d, v, k) || !check_chunks(c, path, d.head, k, v)) return v;
  v.kind = DigestVerdict::intact;
  return v;
}

}  // namespace stratagem::io
