// Strict reading of JSON objects: every field is typed and range-checked, unknown fields are
// errors, and every message names the source file and the field path.
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "stratagem/error.hpp"

namespace stratagem::io {

// Containers nested deeper than this are refused before anything is built: every
// consumer of a parsed value (copies, dump, comparisons) recurses once per level, and a
// 280 KB file can nest 140,000 levels. No model, cluster, plan or config comes near it.
inline constexpr int kMaxJsonDepth = 128;

// Reads a whole file (a regular file, io::read_input_file) and parses it as parse_json does.
// Every JSON file a command reads goes through here. Errors name the file.
nlohmann::json read_json_file(const std::string& path);
// Parses text with comments allowed, refusing a NUL byte (the parser would stop there and
// accept whatever follows) and nesting beyond kMaxJsonDepth; `source` names it in errors.
// Every JSON text from outside the process (files, attributes of HDF5 files) goes through here.
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
