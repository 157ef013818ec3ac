// Runs the stratagem CLI from a test, so that tests exercise the production entry point.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace stratagem::test {

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline std::string stratagem_bin() {
  if (const char* b = std::getenv("STRATAGEM_BIN")) return b;
  return STRATAGEM_BIN;
}

inline RunResult run(const std::string& args) {
  RunResult r;
  std::string cmd = stratagem_bin() + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string source_dir() {
  return STRATAGEM_SOURCE_DIR;
}

}  // namespace stratagem::test
