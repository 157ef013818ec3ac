// Bounds on every count a user can give, shared by the JSON readers and the command-line flags
// so that a flag accepts exactly what the file field accepts, and checked size arithmetic:
// a product of user-given sizes that does not fit is bad input naming the fields, never a
// wrapped-around number.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

namespace stratagem::limits {

// Model shapes (ModelSpec).
inline constexpr int kMaxLayers = 100000;
inline constexpr int kMaxDim = 1 << 30;  // hidden, heads, kv_heads, ffn_hidden, vocab, seq_len
// Cluster.
inline constexpr int kMaxNodes = 1 << 20;
// Plan.
inline constexpr int kMaxTp = 1 << 16;
inline constexpr int kMaxPp = 1 << 16;
inline constexpr int kMaxDp = 1 << 24;
inline constexpr int kMaxVpp = 1024;
inline constexpr int kMaxMicroBatch = 1 << 24;
inline constexpr int kMaxGlobalBatch = 1 << 30;

// Element counts (parameters, activations of one micro-batch, ...) must stay below this, so
// that the byte counts and sums derived from them (x bytes per element, x layers' worth of
// buffers, x categories) keep 2^7 of headroom in int64 arithmetic. 2^56 elements is 72 PB of
// bf16: far beyond any machine, so nothing real is refused.
inline constexpr int64_t kMaxElements = int64_t(1) << 56;

// The product of named factors; throws InputError "<source>: <what> = a x b x ... (fields
// f1 x f2 ...) exceeds 2^56 elements" when it overflows or passes kMaxElements.
int64_t checked_product(const std::string& source, const std::string& what,
                        std::initializer_list<std::pair<const char*, int64_t>> factors);
// a + b with the same rule.
int64_t checked_sum(const std::string& source, const std::string& what, int64_t a, int64_t b);

}  // namespace stratagem::limits
