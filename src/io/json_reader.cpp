#include "stratagem/json_reader.hpp"

#include <cstdint>
#include <limits>
#include <sstream>
#include <string>

#include "stratagem/input_file.hpp"
#include "stratagem/model.hpp"

namespace stratagem::io {

namespace {
// The first of two passes: nlohmann's SAX parser (iterative) walks the text, this counts the
// nesting, and nothing is built. A DOM parse with a parser callback could stop at the limit in
// one pass, but nlohmann's callback parser is quadratic in the number of values (432 s for a
// 14 MB array of 600,000 objects, 0.7 s without it), so the limit is checked first.
class DepthCheck {
 public:
  bool too_deep() const { return too_deep_; }
  bool start_object(std::size_t) { return enter(); }
  bool start_array(std::size_t) { return enter(); }
  bool end_object() { return leave(); }
  bool end_array() { return leave(); }
  bool key(nlohmann::json::string_t&) { return true; }
  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(nlohmann::json::number_integer_t) { return true; }
  bool number_unsigned(nlohmann::json::number_unsigned_t) { return true; }
  bool number_float(nlohmann::json::number_float_t, const nlohmann::json::string_t&) {
    return true;
  }
  bool string(nlohmann::json::string_t&) { return true; }
  bool binary(nlohmann::json::binary_t&) { return true; }
  // The DOM parse that follows reports the error with its own message.
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception&) {
    return false;
  }

 private:
  bool enter() {
    too_deep_ = ++depth_ > kMaxJsonDepth;
    return !too_deep_;
  }
  bool leave() {
    --depth_;
    return true;
  }
  int depth_ = 0;
  bool too_deep_ = false;
};
}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& source) {
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw InputError(source + ": holds a NUL byte at offset " + std::to_string(nul) +
                     ", not JSON text");
  DepthCheck depth;
  nlohmann::json::sax_parse(text, &depth, nlohmann::json::input_format_t::json, /*strict=*/true,
                            /*ignore_comments=*/true);
  if (depth.too_deep())
    throw InputError(source + ": nested deeper than " + std::to_string(kMaxJsonDepth) +
                     " levels, the limit for JSON input");
  try {
    return nlohmann::json::parse(text, nullptr, true, /*ignore_comments=*/true);
  } catch (const nlohmann::json::out_of_range& e) {
    // A number beyond double's range, e.g. 1e400.
    throw InputError(source + ": number out of range: " + shorten(e.what(), 200));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(source + ": malformed JSON: " + shorten(e.what(), 200));
  }
}

nlohmann::json read_json_file(const std::string& path) {
  // The largest plan, 100000 layers with a run each, is ~20 MB.
  constexpr uint64_t kMaxJsonBytes = uint64_t(64) << 20;
  return parse_json(read_input_file(path, kMaxJsonBytes, path, "a JSON file"), path);
}

JsonReader::JsonReader(const nlohmann::json& j, std::string source, std::string path)
    : j_(j), source_(std::move(source)), path_(std::move(path)) {
  if (!j_.is_object())
    throw InputError(source_ + ": " + (path_.empty() ? "top level" : path_) +
                     " must be a JSON object");
}

std::string JsonReader::where(const std::string& key) const {
  return source_ + ": field '" + (path_.empty() ? "" : path_ + ".") + shorten(key) + "'";
}

void JsonReader::fail(const std::string& key, const std::string& expected) const {
  throw InputError(where(key) + ": expected " + expected);
}

const nlohmann::json& JsonReader::need(const char* key) {
  used_.insert(key);
  if (!j_.contains(key)) throw InputError(where(key) + ": missing");
  return j_.at(key);
}

int64_t JsonReader::get_int64(const char* key, int64_t lo) {
  const auto& v = need(key);
  const std::string expected = "an integer >= " + std::to_string(lo);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX))
    fail(key, expected + " that fits 64 bits, got " + v.dump());
  if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x < lo) fail(key, expected + ", got " + v.dump());
    return x;
  }
  // Sizes such as 85.9e9 are written as floats in datasheet-style files.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    // 2^63 is the first double beyond int64; checked before the cast, which would be undefined.
    if (!(d >= static_cast<double>(lo) && d < 9223372036854775808.0) ||
        d != static_cast<double>(static_cast<int64_t>(d)))
      fail(key, expected + ", got " + v.dump());
    return static_cast<int64_t>(d);
  }
  fail(key, expected + ", got " + std::string(v.type_name()));
}

int JsonReader::get_int(const char* key, int lo, int hi) {
  const auto& v = need(key);
  if (!v.is_number_integer()) fail(key, "an integer, got " + std::string(v.type_name()));
  // An unsigned value above int64 must be reported as written, not wrapped to a negative.
  const bool huge = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX);
  const int64_t x = huge ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi)
    fail(key,
         "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  return static_cast<int>(x);
}

int JsonReader::get_int(const char* key, int lo, int hi, int fallback) {
  if (!j_.contains(key)) {
    used_.insert(key);
    return fallback;
  }
  return get_int(key, lo, hi);
}

double JsonReader::get_double(const char* key, double lo, double hi) {
  const auto& v = need(key);
  if (!v.is_number()) fail(key, "a number, got " + std::string(v.type_name()));
  double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    std::ostringstream os;
    os << "a number in [" << lo << ", " << hi << "], got " << x;
    fail(key, os.str());
  }
  return x;
}

double JsonReader::get_double(const char* key, double lo, double hi, double fallback) {
  if (!j_.contains(key)) {
    used_.insert(key);
    return fallback;
  }
  return get_double(key, lo, hi);
}

bool JsonReader::get_bool(const char* key) {
  const auto& v = need(key);
  if (!v.is_boolean()) fail(key, "true or false, got " + std::string(v.type_name()));
  return v.get<bool>();
}

bool JsonReader::get_bool(const char* key, bool fallback) {
  if (!j_.contains(key)) {
    used_.insert(key);
    return fallback;
  }
  return get_bool(key);
}

std::string JsonReader::get_string(const char* key) {
  const auto& v = need(key);
  if (!v.is_string()) fail(key, "a string, got " + std::string(v.type_name()));
  return v.get<std::string>();
}

std::string JsonReader::get_string(const char* key, const std::string& fallback) {
  if (!j_.contains(key)) {
    used_.insert(key);
    return fallback;
  }
  return get_string(key);
}

std::string JsonReader::get_name(const char* key) {
  const std::string name = get_string(key);
  if (!is_safe_name(name))
    fail(key, "a name of at most " + std::to_string(kMaxNameBytes) + " " + kSafeNameChars +
                  " (it is written into job files and onto the terminal), got '" + shorten(name) +
                  "'");
  return name;
}

std::string JsonReader::get_name(const char* key, const std::string& fallback) {
  if (!j_.contains(key)) {
    used_.insert(key);
    return fallback;
  }
  return get_name(key);
}

std::string JsonReader::get_enum(const char* key, std::initializer_list<const char*> choices,
                                 const char* fallback) {
  std::string joined;
  for (const char* c : choices) joined += (joined.empty() ? "" : "|") + std::string(c);
  std::string s = fallback ? get_string(key, fallback) : get_string(key);
  for (const char* c : choices)
    if (s == c) return s;
  fail(key, "one of " + joined + ", got '" + shorten(s) + "'");
}

JsonReader JsonReader::object(const char* key) {
  const auto& v = need(key);
  if (!v.is_object()) fail(key, "an object");
  return JsonReader(v, source_, path_.empty() ? key : path_ + "." + key);
}

const nlohmann::json& JsonReader::array(const char* key) {
  const auto& v = need(key);
  if (!v.is_array()) fail(key, "an array");
  return v;
}

const nlohmann::json& JsonReader::raw(const char* key) {
  return need(key);
}

void JsonReader::reject_unknown() const {
  for (auto it = j_.begin(); it != j_.end(); ++it)
    if (!used_.count(it.key()))
      throw InputError(where(it.key()) + ": unknown field (check the spelling; see the README)");
}

}  // namespace stratagem::io
