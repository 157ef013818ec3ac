// Strict reading of JSON objects: every field is typed and range-checked, unknown fields are
// errors, and every message names the source file and the field path.
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "stratagem/error.hpp"

namespace stratagem::io {

// Reads a whole file and parses it with comments allowed. Errors name the file.
nlohmann::json read_json_file(const std::string& path);
// Parses text; `source` names it in errors.
nlohmann::json parse_json(const std::string& text, const std::string& source);

class JsonReader {
 public:
  JsonReader(const nlohmann::json& j, std::string source, std::string path = "");
  bool has(const char* key) const { return j_.contains(key); }

  int get_int(const char* key, int lo, int hi);
  int get_int(const char* key, int lo, int hi, int fallback);
  int64_t get_int64(const char* key, int64_t lo);
  double get_double(const char* key, double lo, double hi);
  double get_double(const char* key, double lo, double hi, double fallback);
  bool get_bool(const char* key);
  bool get_bool(const char* key, bool fallback);
  std::string get_string(const char* key);
  std::string get_string(const char* key, const std::string& fallback);
  // A string that is a safe name (stratagem::is_safe_name): names reach job files and the
  // terminal.
  std::string get_name(const char* key);
  std::string get_name(const char* key, const std::string& fallback);
  // One of `choices` (joined with '|' in errors).
  std::string get_enum(const char* key, std::initializer_list<const char*> choices,
                       const char* fallback = nullptr);
  JsonReader object(const char* key);
  const nlohmann::json& array(const char* key);
  const nlohmann::json& raw(const char* key);

  // Throws if the object holds a field that no get_* asked for.
  void reject_unknown() const;
  [[noreturn]] void fail(const std::string& key, const std::string& expected) const;
  std::string where(const std::string& key) const;

 private:
  const nlohmann::json& need(const char* key);
  const nlohmann::json& j_;
  std::string source_, path_;
  std::set<std::string> used_;
};

}  // namespace stratagem::io
