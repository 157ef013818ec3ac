#include "stratagem/input_file.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "stratagem/error.hpp"

namespace stratagem::io {

std::string size_text(uint64_t bytes) {
  if (bytes >= (uint64_t(1) << 20) && bytes % (uint64_t(1) << 20) == 0)
    return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " bytes";
}

uint64_t check_input_file(const std::string& path, const std::string& label,
                          const std::string& expected) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InputError(label + ": cannot open file (" + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode)) throw InputError(label + ": is a directory, expected " + expected);
  if (!S_ISREG(st.st_mode))
    throw InputError(label + ": is not a regular file (a FIFO, device or socket), expected " +
                     expected);
  return uint64_t(st.st_size);
}

std::string read_input_file(const std::string& path, uint64_t max_bytes, const std::string& label,
                            const std::string& expected) {
  const auto too_large = [&] {
    return InputError(label + ": larger than " + size_text(max_bytes) + ", the limit for " +
                      expected);
  };
  if (check_input_file(path, label, expected) > max_bytes) throw too_large();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(label + ": cannot open file");
  std::string text;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, size_t(in.gcount()));
    if (text.size() > max_bytes) throw too_large();
  }
  if (in.bad()) throw InputError(label + ": read error");
  return text;
}

}  // namespace stratagem::io
