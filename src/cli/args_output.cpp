// Output flags: every file a command writes is checked once, before any work, by one rule
// (stratagem/output_file.hpp), and an output that names the same file as another argument (an
// input, or a second output) is refused: `tokenize x -o x` or `train --data f --trace f` would
// destroy the input. So is one that is the file a built-in name resolved to (--model gpt2-124m
// with -o data/models/gpt2-124m.json), and one inside a folder the run owns (train's
// --ckpt-dir, whose checkpoints are inputs under --resume).
#include <sys/stat.h>

#include <filesystem>
#include <iterator>
#include <utility>

#include "src/cli/args.hpp"
#include "stratagem/error.hpp"
#include "stratagem/output_file.hpp"

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

// Whether `path` is `dir` or lies under it, links resolved (the path need not exist yet).
bool inside(const std::string& path, const std::string& dir) {
  std::error_code ec1, ec2;
  const auto p = std::filesystem::weakly_canonical(path, ec1);
  const auto d = std::filesystem::weakly_canonical(dir, ec2);
  if (ec1 || ec2) return false;
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di, ++pi) {
    if (di->empty() && std::next(di) == d.end()) break;  // a trailing '/' of the folder
    if (pi == p.end() || *pi != *di) return false;
  }
  return true;
}

// Any argument's (flag, value): `--flag value`, `--flag=value`, or a positional (flag "").
std::pair<std::string, std::string> argument_at(const std::vector<std::string>& tokens, size_t i) {
  std::string t = tokens[i], name = i > 0 ? tokens[i - 1] : "";
  if (const auto eq = t.find('='); t.rfind("-", 0) == 0 && eq != std::string::npos)
    name = t.substr(0, eq), t = t.substr(eq + 1);
  return {name, t};
}
}  // namespace

std::optional<std::string> Args::output(const std::string& flag) {
  auto v = value(flag);
  if (v) outputs_.emplace_back(flag, *v);
  return v;
}

void Args::input(const std::string& flag, const std::string& given, const std::string& path) {
  inputs_.push_back({flag, given, path});
}

void Args::owned_folder(const std::string& flag, const std::string& dir) {
  owned_folders_.emplace_back(flag, dir);
}

void Args::check_outputs() const {
  for (size_t k = 0; k < outputs_.size(); ++k) {
    const auto& [flag, path] = outputs_[k];
    refuse_inside_owned_folder(flag, path);  // first: the folder may not exist yet
    io::check_output_path(command_ + ": " + flag, path);
    for (size_t j = k + 1; j < outputs_.size(); ++j)
      if (same_file(path, outputs_[j].second))
        throw InputError(command_ + ": " + flag + " " + path + ": the same file as " +
                         outputs_[j].first + ": give each output its own file");
    refuse_argument_input(flag, path);
    refuse_resolved_input(flag, path);
  }
  refuse_arguments_inside_owned_folders();
}

void Args::refuse_argument_input(const std::string& flag, const std::string& path) const {
  // Any other argument naming the same existing file is an input (a flag's value or a
  // positional): comparing every token needs no list of which flags read files.
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const auto [name, t] = argument_at(tokens_, i);
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

void Args::refuse_resolved_input(const std::string& flag, const std::string& path) const {
  for (const auto& in : inputs_)
    if (same_file(path, in.path))
      throw InputError(command_ + ": " + flag + " " + path + ": the same file as " + in.flag + " " +
                       in.given + " (an input, " + in.path + "): refusing to overwrite it");
}

void Args::refuse_inside_owned_folder(const std::string& flag, const std::string& path) const {
  for (const auto& [owner, dir] : owned_folders_)
    if (inside(path, dir))
      throw InputError(command_ + ": " + flag + " " + path + ": inside " + owner + " " + dir +
                       ", whose files the run reads, replaces and removes: write it elsewhere");
}

void Args::refuse_arguments_inside_owned_folders() const {
  // An input there (--data ck/step-00000001.h5) would be removed by --overwrite or rotation.
  for (const auto& [owner, dir] : owned_folders_)
    for (size_t i = 0; i < tokens_.size(); ++i) {
      const auto [name, t] = argument_at(tokens_, i);
      struct stat st {};
      if (t.empty() || name == owner || t == owner || ::stat(t.c_str(), &st) != 0) continue;
      if (inside(t, dir))
        throw InputError(command_ + ": " + (name.rfind("-", 0) == 0 ? name + " " : "") + t +
                         ": inside " + owner + " " + dir +
                         ", whose files the run replaces and removes: keep inputs outside it");
    }
}

}  // namespace stratagem::cli
