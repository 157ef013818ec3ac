// Training data: pre-tokenized token streams (llm.c .bin or HDF5), a byte-level tokenizer, and
// batches sampled deterministically from (seed, step, sample index), so that any rank layout
// sees the same global batch and a resumed run sees the same data as an uninterrupted one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace stratagem {

class TokenDataset {
 public:
  // Reads llm.c's .bin (256 x int32 header: magic 20240520, version 1, token count; then uint16
  // tokens) or an HDF5 file with an integer dataset "/tokens". Errors name the file.
  static TokenDataset load(const std::string& path);
  static TokenDataset from_tokens(std::vector<uint16_t> tokens, std::string name);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::string& path() const { return path_; }
  int max_token() const { return max_token_; }
  // Throws InputError when the file is too small for a sequence or has ids >= vocab.
  void check_fits(int seq_len, int vocab) const;
  // One sample: seq_len inputs and the next-token targets, starting at a position chosen by a
  // counter-based hash of (seed, step, global sample index).
  void sample(uint64_t seed, int64_t step, int64_t sample_index, int seq_len, int32_t* tokens,
              int32_t* targets) const;
  // Unigram entropy of the stream in nats: the loss a model that ignores context reaches.
  double unigram_entropy_nats() const;

 private:
  std::vector<uint16_t> tokens_;
  std::string path_;
  int max_token_ = 0;
};

// Byte-level tokenizer: every byte is one token (vocab 256).
std::vector<uint16_t> tokenize_bytes(const std::string& text);
// Writes tokens in llm.c's .bin format, atomically.
void write_token_bin(const std::string& path, const std::vector<uint16_t>& tokens);

}  // namespace stratagem
