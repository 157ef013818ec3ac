// Running the stratagem binary that ctest names (STRATAGEM_BIN) from a Boost test and reading
// its --json answer.
#pragma once
#include <array>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

namespace stratagem::test {

// `stratagem <cmd> <args> --json` on stdout (stderr dropped), parsed; fails on a non-zero exit.
inline nlohmann::json run_json(const std::string& cmd_and_args) {
  const char* b = std::getenv("STRATAGEM_BIN");
  BOOST_REQUIRE_MESSAGE(b, "STRATAGEM_BIN is not set (ctest sets it)");
  std::string out;
  std::FILE* f = popen((std::string(b) + " " + cmd_and_args + " --json 2>/dev/null").c_str(), "r");
  BOOST_REQUIRE(f);
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  BOOST_REQUIRE(pclose(f) == 0);
  return nlohmann::json::parse(out);
}

}  // namespace stratagem::test
