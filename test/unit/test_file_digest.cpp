// The file digest kept in an HDF5 user block (src/io/file_digest.hpp): XXH64 against the
// reference values of xxHash, streaming equal to one call at every split, and seal/verify on a
// real HDF5 file with a user block: intact, each kind of damage told apart, a file without a
// user block reported as absent. (Sealing and verifying over several ranks are exercised by
// test/runtime/checkpoint_trust.sh, cross-checked by an independent Python implementation.)
#define BOOST_TEST_MODULE file_digest
#include <hdf5.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "src/io/file_digest.hpp"

using namespace stratagem::io;

namespace {
std::string temp_path(const char* stem) {
  return "/tmp/stratagem-test-digest-" + std::to_string(::getpid()) + "-" + stem + ".h5";
}
// An HDF5 file of ~`floats` floats with a user block of `block` bytes (0: none).
void write_h5(const std::string& path, hsize_t block, hsize_t floats) {
  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE);
  if (block) H5Pset_userblock(fcpl, block);
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl, H5P_DEFAULT);
  BOOST_REQUIRE(f >= 0);
  std::vector<float> v(floats);
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i) * 0.5f;
  hid_t space = H5Screate_simple(1, &floats, nullptr);
  hid_t ds = H5Dcreate2(f, "x", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Dclose(ds), H5Sclose(space), H5Fclose(f), H5Pclose(fcpl);
}
std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_all(const std::string& path, const std::vector<char>& b) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(b.data(), std::streamsize(b.size()));
}
// The file with byte `at` flipped, judged.
DigestVerdict flipped(const std::string& path, size_t at) {
  std::vector<char> b = read_all(path);
  b[at] ^= 0x20;
  const std::string p = path + ".flipped";
  write_all(p, b);
  DigestVerdict v = verify_file_digest(MPI_COMM_NULL, p);
  std::remove(p.c_str());
  return v;
}
}  // namespace

BOOST_AUTO_TEST_CASE(xxh64_reference_values) {
  // From xxHash's own tests (and Python's xxhash.xxh64).
  BOOST_TEST(xxh64("", 0, 0) == 0xEF46DB3751D8E999ULL);
  BOOST_TEST(xxh64("a", 1, 0) == 0xD24EC4F1A98C6E5BULL);
  BOOST_TEST(xxh64("abc", 3, 0) == 0x44BC2CF5AD770999ULL);
  const std::string s = "Nobody inspects the spammish repetition";
  BOOST_TEST(xxh64(s.data(), s.size(), 0) == 0xFBCEA83C8A378BF1ULL);
}

BOOST_AUTO_TEST_CASE(xxh64_streaming_equals_one_call) {
  std::vector<unsigned char> data(300);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7 + 3);
  for (size_t n : {0, 1, 3, 4, 7, 8, 31, 32, 33, 63, 64, 65, 100, 300}) {
    const uint64_t whole = xxh64(data.data(), n, 42);
    for (size_t split = 0; split <= n; ++split) {
      Xxh64 h(42);
      h.update(data.data(), split);
      h.update(data.data() + split, n - split);
      BOOST_TEST(h.digest() == whole, "n " << n << " split " << split);
    }
  }
}

BOOST_AUTO_TEST_CASE(block_size_scales_with_the_file) {
  BOOST_TEST(digest_block_bytes(0) == 4096u);
  BOOST_TEST(digest_block_bytes(uint64_t(1) << 30) == 4096u);
  // 500 GB at 64 MiB chunks: ~7,500 chunks, twice that with the margin: 128 KiB.
  BOOST_TEST(digest_block_bytes(uint64_t(500) << 30) == uint64_t(128) << 10);
}

BOOST_AUTO_TEST_CASE(seal_and_verify) {
  const std::string path = temp_path("seal");
  write_h5(path, 4096, 20000);  // ~80 KB after the block
  seal_file_digest(MPI_COMM_NULL, path, 4096, 8192);
  DigestVerdict v = verify_file_digest(MPI_COMM_NULL, path);
  BOOST_TEST(v.kind == DigestVerdict::intact, v.why);
  // Still a plain HDF5 file.
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  BOOST_TEST(f >= 0);
  H5Fclose(f);

  const size_t size = read_all(path).size();
  // A byte of the data: the chunk it falls in is named.
  v = flipped(path, 4096 + 3 * 8192 + 5);
  BOOST_TEST(v.kind == DigestVerdict::failed);
  BOOST_TEST(v.why.find("fails its digest (damaged): 1 of ") == 0, v.why);
  BOOST_TEST(v.why.find("chunks of 8192 bytes differ, the first at bytes [28672, 36864)") !=
                 std::string::npos,
             v.why);
  // The last byte (a short last chunk).
  v = flipped(path, size - 1);
  BOOST_TEST(v.why.find("fails its digest") == 0, v.why);
  // The header, its chunk hashes, the magic.
  BOOST_TEST(flipped(path, 40).why == "digest damaged (its header is inconsistent)");
  BOOST_TEST(flipped(path, 70).why == "digest damaged (its header fails its own hash)");
  BOOST_TEST(flipped(path, 3).why ==
             "no digest, and no HDF5 superblock at its start (not a stratagem file, or damaged)");
  // The user block's padding (which HDF5 ignores): no byte goes unchecked.
  BOOST_TEST(flipped(path, 1000).why ==
             "digest damaged (1 bytes of its user block's padding are not zero)");
  // Cut short, extended.
  std::vector<char> b = read_all(path);
  b.resize(size - 100);
  write_all(path + ".cut", b);
  v = verify_file_digest(MPI_COMM_NULL, path + ".cut");
  BOOST_TEST(v.why == std::to_string(size - 100) + " bytes, its digest says " +
                          std::to_string(size) + " bytes (cut short or extended)");
  b.resize(size + 1);
  write_all(path + ".cut", b);
  BOOST_TEST(verify_file_digest(MPI_COMM_NULL, path + ".cut").kind == DigestVerdict::failed);
  // Shorter than a header.
  b.resize(20);
  write_all(path + ".cut", b);
  BOOST_TEST(verify_file_digest(MPI_COMM_NULL, path + ".cut").why ==
             "digest cut short (20 bytes in all)");
  std::remove((path + ".cut").c_str());
  // Missing.
  v = verify_file_digest(MPI_COMM_NULL, path + ".none");
  BOOST_TEST(v.why == "cannot be read (No such file or directory)");
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(a_file_outgrowing_its_block_gets_larger_chunks) {
  const std::string path = temp_path("grow");
  write_h5(path, 512, 60000);  // 240 KB: 4 KiB chunks would need 60 hashes, 512 bytes hold 56
  seal_file_digest(MPI_COMM_NULL, path, 512, 4096);
  const std::vector<char> b = read_all(path);
  uint64_t chunk = 0;
  for (int i = 7; i >= 0; --i) chunk = chunk << 8 | static_cast<unsigned char>(b[40 + i]);
  BOOST_TEST(chunk == 8192u);
  BOOST_TEST(verify_file_digest(MPI_COMM_NULL, path).kind == DigestVerdict::intact);
  std::remove(path.c_str());
}

BOOST_AUTO_TEST_CASE(a_plain_hdf5_file_has_no_digest) {
  const std::string path = temp_path("plain");
  write_h5(path, 0, 2000);  // larger than the block asked for below
  const DigestVerdict v = verify_file_digest(MPI_COMM_NULL, path);
  BOOST_TEST(v.kind == DigestVerdict::absent);
  BOOST_TEST(v.why == "no digest (an HDF5 file without a user block: written before digests)");
  // And cannot be sealed: it has no room.
  BOOST_CHECK_THROW(seal_file_digest(MPI_COMM_NULL, path, 4096), std::runtime_error);
  std::remove(path.c_str());
}
