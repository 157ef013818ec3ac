#include "src/io/atomic_file.hpp"

#include <unistd.h>

#include <filesystem>

#include "stratagem/output_file.hpp"

namespace stratagem::io {

std::string temporary_path_for(const std::string& path) {
  std::filesystem::path p(path);
  auto dir = p.parent_path();
  std::string name = "." + p.filename().string() + ".tmp." + std::to_string(::getpid());
  return (dir.empty() ? std::filesystem::path(name) : dir / name).string();
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  write_output("", path, contents);
}

}  // namespace stratagem::io
