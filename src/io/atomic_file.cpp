#include "src/io/atomic_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "stratagem/error.hpp"

namespace stratagem::io {

std::string temporary_path_for(const std::string& path) {
  std::filesystem::path p(path);
  auto dir = p.parent_path();
  std::string name = "." + p.filename().string() + ".tmp." + std::to_string(::getpid());
  return (dir.empty() ? std::filesystem::path(name) : dir / name).string();
}

void write_file_atomic(const std::string& path, const std::string& contents) {
  std::string tmp = temporary_path_for(path);
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw InputError(path + ": cannot write (" + std::strerror(errno) + ")");
  bool ok = std::fwrite(contents.data(), 1, contents.size(), f) == contents.size();
  ok = (std::fflush(f) == 0) && ok;
  ok = (::fsync(::fileno(f)) == 0) && ok;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw InputError(path + ": write failed (" + std::strerror(errno) + ")");
  }
}

}  // namespace stratagem::io
