// Output flags: every file a command writes is checked once, before any work, by one rule
// (src/io/output_file.hpp), and an output that names the same file as another argument (an
// input, or a second output) is refused: `tokenize x -o x` or `train --data f --trace f` would
// destroy the input.
#include <sys/stat.h>

#include <filesystem>

#include "src/cli/args.hpp"
#include "src/io/output_file.hpp"
#include "stratagem/error.hpp"

namespace stratagem::cli {

namespace {
// Whether `a` and `b` name one file: the same inode when both exist, else the same path.
bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {
  }, sb{};
  const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
  if (ea || eb) return ea && eb && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  std::error_code ec1, ec2;
  const auto ca = std::filesystem::weakly_canonical(a, ec1);
  const auto cb = std::filesystem::weakly_canonical(b, ec2);
  return !ec1 && !ec2 && ca == cb;
}
}  // namespace

std::optional<std::string> Args::output(const std::string& flag) {
  auto v = value(flag);
  if (v) outputs_.emplace_back(flag, *v);
  return v;
}

void Args::check_outputs() const {
  for (size_t k = 0; k < outputs_.size(); ++k) {
    const auto& [flag, path] = outputs_[k];
    io::check_output_path(command_ + ": " + flag, path);
    for (size_t j = k + 1; j < outputs_.size(); ++j)
      if (same_file(path, outputs_[j].second))
        throw InputError(command_ + ": " + flag + " " + path + ": the same file as " +
                         outputs_[j].first + ": give each output its own file");
    // Any other argument naming the same existing file is an input (a flag's value or a
    // positional): comparing every token needs no list of which flags read files.
    for (size_t i = 0; i < tokens_.size(); ++i) {
      std::string t = tokens_[i], name = i > 0 ? tokens_[i - 1] : "";
      if (const auto eq = t.find('='); t.rfind("-", 0) == 0 && eq != std::string::npos)
        name = t.substr(0, eq), t = t.substr(eq + 1);
      if (t.empty() || name == flag) continue;
      bool an_output = false;
      for (const auto& o : outputs_) an_output = an_output || (o.first == name && o.second == t);
      if (an_output || t == flag) continue;
      struct stat st {};
      if (::stat(t.c_str(), &st) != 0 || !same_file(path, t)) continue;
      const std::string given =
          name.rfind("-", 0) == 0 ? name + " " + t + " (an input)" : "the input " + t;
      throw InputError(command_ + ": " + flag + " " + path + ": the same file as " + given +
                       ": refusing to overwrite it");
    }
  }
}

}  // namespace stratagem::cli
