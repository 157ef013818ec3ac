// Errors that reach the user. InputError means "you gave us something wrong" and maps to exit
// code 2; everything else is a bug or an environment failure.
#pragma once
#include <algorithm>
#include <stdexcept>
#include <string>

namespace stratagem {

// Bad input: a file, field or flag that is missing or out of range. The message must name the
// file/flag and the field, and say what was expected.
class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

// A feature that exists in the plan space but is not implemented by this executor yet.
class NotSupported : public std::runtime_error {
 public:
  explicit NotSupported(const std::string& what) : std::runtime_error(what) {}
};

// User text quoted in an error message, cut to `max` bytes so that a 10 MB key or value is not
// echoed back in full; control characters are shown as '?', so the message stays one line.
inline std::string shorten(const std::string& text, size_t max = 64) {
  std::string out = text.substr(0, std::min(text.size(), max));
  for (char& ch : out)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
  if (text.size() > max) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitNoFeasiblePlan = 3;

}  // namespace stratagem
