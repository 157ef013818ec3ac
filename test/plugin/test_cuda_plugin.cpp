// The CUDA plugin is found, checked and refused as stratagem/cuda_device.hpp says, in every
// build: the binary links no CUDA library; `stratagem --version` names the plugin beside it
// (or what is missing); a plugin that is absent, not a plugin, built from other headers, or
// that cannot load (as when a CUDA library is missing) is named in one line.
#define BOOST_TEST_MODULE cuda_plugin
#include <dlfcn.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <string>

#include "stratagem/cuda_device.hpp"
#include "test/support/run.hpp"

using namespace stratagem;

namespace {
// `stratagem --version` with $STRATAGEM_CUDA_PLUGIN set to `plugin` (unset when empty): its
// plugin line (the second).
std::string plugin_line(const std::string& plugin) {
  const std::string env = plugin.empty() ? "env -u STRATAGEM_CUDA_PLUGIN "
                                         : "env STRATAGEM_CUDA_PLUGIN='" + plugin + "' ";
  FILE* p = ::popen((env + test::stratagem_bin() + " --version 2>&1").c_str(), "r");
  BOOST_REQUIRE(p);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  BOOST_TEST(::pclose(p) == 0);
  const size_t nl = out.find('\n');
  BOOST_REQUIRE(nl != std::string::npos);
  BOOST_TEST(out.substr(0, nl).rfind("stratagem ", 0) == 0u);
  std::string line = out.substr(nl + 1);
  BOOST_TEST(std::count(line.begin(), line.end(), '\n') == 1, "one line: " << line);
  return line;
}
bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
}  // namespace

BOOST_AUTO_TEST_CASE(binary_links_no_cuda_library) {
  FILE* p = ::popen(("ldd " + test::stratagem_bin()).c_str(), "r");
  BOOST_REQUIRE(p);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  BOOST_TEST(::pclose(p) == 0);
  BOOST_TEST(has(out, "libmpi"), out);  // ldd did list the libraries
  for (const char* lib : {"libcuda", "libcudart", "libcublas", "libnccl"})
    BOOST_TEST(!has(out, lib), lib << " in: " << out);
}

BOOST_AUTO_TEST_CASE(version_names_the_plugin_beside_the_binary) {
  const auto beside =
      (std::filesystem::path(test::stratagem_bin()).parent_path() / "libstratagem_cuda.so")
          .string();
  const std::string line = plugin_line("");
#if defined(STRATAGEM_PLUGIN_BUILT)
  BOOST_TEST(
      line.rfind("CUDA plugin: " + std::filesystem::canonical(beside).string() + " (CUDA runtime ",
                 0) == 0u,
      line);
  BOOST_TEST((has(line, "no CUDA device: ") || has(line, "device(s), device 0 ")), line);
#else
  BOOST_TEST(has(line, "CUDA plugin: none: the CUDA plugin "), line);
  BOOST_TEST(has(line, "libstratagem_cuda.so is not there"), line);
#endif
}

BOOST_AUTO_TEST_CASE(a_missing_foreign_or_broken_plugin_is_named) {
  std::string line = plugin_line("/nonexistent/libstratagem_cuda.so");
  BOOST_TEST(has(line,
                 "CUDA plugin: none: the CUDA plugin /nonexistent/libstratagem_cuda.so "
                 "is not there"),
             line);

  Dl_info libm{};
  BOOST_REQUIRE(::dladdr(reinterpret_cast<void*>(static_cast<double (*)(double)>(&::cos)), &libm));
  line = plugin_line(libm.dli_fname);
  BOOST_TEST(has(line, std::string(libm.dli_fname) +
                           ": not a stratagem CUDA plugin (no stratagem_cuda_plugin symbol)"),
             line);

  line = plugin_line(FAKE_OTHER_BUILD);
  BOOST_TEST(has(line, std::string("the CUDA plugin ") + FAKE_OTHER_BUILD +
                           " was built from other sources (interface 1/0000000000000000"),
             line);
  BOOST_TEST(has(line, "use the plugin built with this binary"), line);

  line = plugin_line(FAKE_UNRESOLVED);
  BOOST_TEST(has(line, "cannot load the CUDA plugin: "), line);
  BOOST_TEST(has(line, "undefined symbol: stratagem_fake_missing_symbol"), line);
}

// In this process (a test binary beside the plugin, as the GPU tests are).
BOOST_AUTO_TEST_CASE(loads_in_process_and_asks_the_driver_first) {
  const std::string loaded = cuda::load_plugin();
#if defined(STRATAGEM_PLUGIN_BUILT)
  BOOST_TEST(loaded == "", loaded);
  BOOST_TEST(!cuda::runtime_version().empty());
#else
  BOOST_TEST(has(loaded, "is not there"), loaded);
#endif
  std::string why;
  if (cuda::driver_device_count(&why) == 0) {
    BOOST_TEST(!why.empty());
    BOOST_TEST(cuda::device_count() == 0);
    BOOST_TEST(cuda::unavailable_reason() == "no CUDA device: " + why);
    BOOST_TEST(cuda::no_device_reason() == why);
  }
}

// `train` on a node whose driver shows a GPU (a stand-in libcuda.so.1) defaults to cuda; a
// plugin that cannot load there ends it with exit 2 and one line naming why, before any data
// is read. --backend cpu never asks for the plugin.
BOOST_AUTO_TEST_CASE(train_on_a_gpu_node_names_a_plugin_that_cannot_load) {
  const std::string env = std::string("env -u STRATAGEM_BACKEND LD_LIBRARY_PATH=") +
                          FAKE_DRIVER_DIR + " STRATAGEM_CUDA_PLUGIN=" + FAKE_UNRESOLVED + " ";
  const std::string args =
      " train --layers 2 --hidden 64 --heads 4 --vocab 256 --seq-len 32 --global-batch 8 "
      "--micro-batch 2 --data /nonexistent/data.bin --steps 1";
  auto run = [](const std::string& cmd) {
    test::RunResult r;
    FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
    BOOST_REQUIRE(p);
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
    const int status = ::pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  };
  auto r = run(env + test::stratagem_bin() + args);
  BOOST_TEST(r.exit_code == 2, r.output);
  BOOST_TEST(std::count(r.output.begin(), r.output.end(), '\n') == 1, r.output);
  BOOST_TEST(has(r.output, "--backend cuda: cannot load the CUDA plugin: "), r.output);
  BOOST_TEST(has(r.output, "undefined symbol: stratagem_fake_missing_symbol"), r.output);

  r = run(env + test::stratagem_bin() + args + " --backend cpu");
  BOOST_TEST(r.exit_code == 2, r.output);
  BOOST_TEST(has(r.output, "--data /nonexistent/data.bin: cannot open file"), r.output);
}
