#include "stratagem/limits.hpp"

#include "stratagem/error.hpp"

namespace stratagem::limits {

namespace {
[[noreturn]] void too_big(const std::string& source, const std::string& what,
                          const std::string& fields) {
  throw InputError(source + ": " + what + " (" + fields +
                   ") is too large: more than 2^56 elements, beyond any machine");
}
}  // namespace

int64_t checked_product(const std::string& source, const std::string& what,
                        std::initializer_list<std::pair<const char*, int64_t>> factors) {
  std::string fields;
  for (const auto& [name, v] : factors)
    fields += (fields.empty() ? "" : " x ") + std::string(name) + " " + std::to_string(v);
  int64_t p = 1;
  for (const auto& [name, v] : factors) {
    if (v < 0) throw InputError(source + ": " + what + " (" + fields + "): negative size");
    if (__builtin_mul_overflow(p, v, &p) || p > kMaxElements) too_big(source, what, fields);
  }
  return p;
}

int64_t checked_sum(const std::string& source, const std::string& what, int64_t a, int64_t b) {
  int64_t s = 0;
  if (__builtin_add_overflow(a, b, &s) || s > kMaxElements)
    too_big(source, what, std::to_string(a) + " + " + std::to_string(b));
  return s;
}

}  // namespace stratagem::limits
