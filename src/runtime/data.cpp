#include "stratagem/data.hpp"

#include <hdf5.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "stratagem/error.hpp"
#include "stratagem/hdf5_guard.hpp"
#include "stratagem/hdf5_util.hpp"
#include "stratagem/input_file.hpp"
#include "stratagem/output_file.hpp"

namespace stratagem {

namespace {
constexpr int32_t kBinMagic = 20240520;
constexpr int32_t kBinVersion = 1;
constexpr int kHeaderInts = 256;

// splitmix64: a counter-based generator, so sample positions depend only on their inputs.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

bool is_hdf5(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  return in.gcount() == 8 && std::memcmp(sig, "\x89HDF\r\n\x1a\n", 8) == 0;
}

// Every libhdf5 call on the file: run in a child process (see load_hdf5_tokens).
std::vector<uint16_t> read_hdf5_tokens(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = f >= 0 ? H5Dopen2(f, "/tokens", H5P_DEFAULT) : -1;
  std::vector<uint16_t> out;
  std::string err;
  if (f < 0)
    err = "cannot open as HDF5 (truncated or corrupt?)";
  else if (d < 0)
    err = "no dataset '/tokens'";
  else {
    hid_t s = H5Dget_space(d);
    hssize_t n = H5Sget_simple_extent_npoints(s);
    // The count comes from the file: a damaged header may claim far more than it stores.
    const hsize_t stored = H5Dget_storage_size(d);
    const std::string layout = n > 0 ? io::check_1d_layout(d, hsize_t(n)) : "";
    hid_t type = H5Dget_type(d);
    const H5T_class_t type_class = type >= 0 ? H5Tget_class(type) : H5T_NO_CLASS;
    if (type >= 0) H5Tclose(type);
    if (type_class != H5T_INTEGER) {
      // libhdf5 would convert 3.7 to 3 without a word: token ids are integers.
      err = "dataset '/tokens' does not hold integers (" +
            std::string(type_class == H5T_FLOAT ? "floating-point values" : "another type") +
            "): expected integer token ids";
      n = 0;
    } else if (!layout.empty()) {
      err = "dataset '/tokens' is damaged: " + layout;
      n = 0;
    } else if (n > 0 &&
               (uint64_t(n) > (uint64_t(1) << 36) || uint64_t(n) > 64 * stored + (1 << 20))) {
      err = "dataset '/tokens' claims " + std::to_string(n) + " tokens but stores " +
            std::to_string(stored) + " bytes (damaged?)";
      n = 0;
    }
    std::vector<int32_t> tmp(n > 0 ? n : 0);
    if (!err.empty()) {
      // already refused
    } else if (n <= 0 ||
               H5Dread(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, tmp.data()) < 0) {
      err = "cannot read dataset '/tokens'";
    } else {
      out.reserve(tmp.size());
      for (int32_t t : tmp) {
        if (t < 0 || t > 65535) {
          err = "token id " + std::to_string(t) + " outside [0, 65535]";
          break;
        }
        out.push_back(static_cast<uint16_t>(t));
      }
    }
    H5Sclose(s);
  }
  if (d >= 0) H5Dclose(d);
  if (f >= 0) H5Fclose(f);
  if (!err.empty()) throw InputError("--data " + path + ": " + err);
  return out;
}

std::vector<uint16_t> load_hdf5_tokens(const std::string& path) {
  io::silence_hdf5_errors();  // we report errors ourselves, also at exit
  // A user's file, never verified: libhdf5 may crash on it or loop forever, so it is read in a
  // child process, bounded in time (hdf5_guard.hpp).
  const std::string bytes = io::read_isolated(path, [&] {
    const std::vector<uint16_t> tokens = read_hdf5_tokens(path);
    return std::string(reinterpret_cast<const char*>(tokens.data()),
                       tokens.size() * sizeof(uint16_t));
  });
  std::vector<uint16_t> out(bytes.size() / sizeof(uint16_t));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(uint16_t));
  return out;
}
}  // namespace

TokenDataset TokenDataset::from_tokens(std::vector<uint16_t> tokens, std::string name) {
  TokenDataset d;
  d.tokens_ = std::move(tokens);
  d.path_ = std::move(name);
  for (uint16_t t : d.tokens_) d.max_token_ = std::max<int>(d.max_token_, t);
  return d;
}

TokenDataset TokenDataset::load(const std::string& path) {
  const uint64_t file_bytes =
      io::check_input_file(path, "--data " + path, "a .bin or HDF5 token file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("--data " + path + ": cannot open file");
  if (is_hdf5(path)) return from_tokens(load_hdf5_tokens(path), path);
  int32_t header[kHeaderInts] = {};
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  if (in.gcount() != sizeof(header))
    throw InputError("--data " + path +
                     ": shorter than the 1024-byte llm.c header (not a .bin token file?)");
  if (header[0] != kBinMagic)
    throw InputError("--data " + path + ": bad magic " + std::to_string(header[0]) +
                     " (expected llm.c's 20240520, or an HDF5 file with /tokens)");
  if (header[1] != kBinVersion)
    throw InputError("--data " + path + ": unsupported .bin version " + std::to_string(header[1]));
  if (header[2] < 0) throw InputError("--data " + path + ": negative token count in header");
  // Checked against the file's size before allocating: a damaged header may promise 2^31.
  if (uint64_t(header[2]) * sizeof(uint16_t) + sizeof(header) > file_bytes)
    throw InputError("--data " + path + ": header promises " + std::to_string(header[2]) +
                     " tokens but the file is truncated");
  std::vector<uint16_t> tokens(static_cast<size_t>(header[2]));
  in.read(reinterpret_cast<char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  if (in.gcount() != static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)))
    throw InputError("--data " + path + ": header promises " + std::to_string(header[2]) +
                     " tokens but the file is truncated");
  return from_tokens(std::move(tokens), path);
}

void TokenDataset::check_fits(int seq_len, int vocab) const {
  if (size() < seq_len + 1)
    throw InputError("--data " + path_ + ": " + std::to_string(size()) +
                     " tokens is too small for one sequence of " + std::to_string(seq_len) +
                     " + 1");
  if (max_token_ >= vocab)
    throw InputError("--data " + path_ + ": token id " + std::to_string(max_token_) +
                     " does not fit the model's vocab of " + std::to_string(vocab));
}

void TokenDataset::sample(uint64_t seed, int64_t step, int64_t sample_index, int seq_len,
                          int32_t* tokens, int32_t* targets) const {
  const uint64_t span = static_cast<uint64_t>(size() - seq_len);
  const uint64_t h =
      mix(mix(mix(seed) ^ static_cast<uint64_t>(step)) ^ static_cast<uint64_t>(sample_index));
  const int64_t start = static_cast<int64_t>(h % span);
  for (int t = 0; t < seq_len; ++t) {
    tokens[t] = tokens_[start + t];
    targets[t] = tokens_[start + t + 1];
  }
}

double TokenDataset::unigram_entropy_nats() const {
  std::vector<int64_t> counts(max_token_ + 1, 0);
  for (uint16_t t : tokens_) counts[t]++;
  double h = 0;
  for (int64_t c : counts)
    if (c > 0) {
      double p = double(c) / double(tokens_.size());
      h -= p * std::log(p);
    }
  return h;
}

std::vector<uint16_t> tokenize_bytes(const std::string& text) {
  std::vector<uint16_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

void write_token_bin(const std::string& path, const std::vector<uint16_t>& tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    throw InputError(path + ": more tokens than the .bin header can count");
  int32_t header[kHeaderInts] = {};
  header[0] = kBinMagic;
  header[1] = kBinVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  std::string bytes(reinterpret_cast<const char*>(header), sizeof(header));
  bytes.append(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  io::write_output("-o", path, bytes);
}

}  // namespace stratagem
