// `mpirun -np P stratagem simulate ... --json` prints exactly what -np 1 prints, for several
// plans (schedules, ZeRO, offload, recompute, sequence parallelism, stages straddling nodes,
// several iterations), with --mirror (one process per simulated rank), and writes the same trace.
#define BOOST_TEST_MODULE sim_cli_mpi
#include <array>
#include <boost/test/unit_test.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace std::string_literals;
namespace fs = std::filesystem;

namespace {

std::string run(const std::string& cmd, int* rc) {
  std::string out;
  std::FILE* f = popen((cmd + " 2>/dev/null </dev/null").c_str(), "r");
  BOOST_REQUIRE(f);
  std::array<char, 65536> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  const int st = pclose(f);
  *rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

std::string bin() {
  const char* b = std::getenv("STRATAGEM_BIN");
  return b ? b : STRATAGEM_BIN;
}
std::string mpi(int np) {
  return std::string(STRATAGEM_MPIEXEC_CMD) + " -np " + std::to_string(np) + " ";
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

const char* kPlans[] = {
    "--model gpt2-350m --cluster dgx-a100-80g --nodes 2 --tp 2 --pp 4 --dp 2 --micro-batch 1 "
    "--global-batch 16",
    "--model gpt2-350m --cluster dgx-a100-80g --nodes 2 --tp 2 --pp 4 --dp 2 --micro-batch 1 "
    "--global-batch 16 "
    "--schedule gpipe --zero 1 --iterations 2",
    "--model gpt2-350m --cluster dgx-a100-80g --nodes 2 --tp 2 --pp 4 --dp 2 --micro-batch 1 "
    "--global-batch 16 "
    "--schedule interleaved --vpp 2 --sequence-parallel",
    "--model gpt3-1.3b --cluster dgx-a100-80g --nodes 2 --tp 2 --pp 2 --dp 4 --micro-batch 2 "
    "--global-batch 32 "
    "--zero 3 --offload optimizer --recompute full",
    // 6 GPUs per stage on 8-GPU nodes: stages straddle nodes, NICs are shared across processes.
    "--model gpt2-350m --cluster dgx-a100-80g --nodes 3 --tp 2 --pp 4 --dp 3 --micro-batch 1 "
    "--global-batch 12",
    "--model llama2-7b --cluster dgx-h100 --nodes 4 --tp 4 --pp 4 --dp 2 --micro-batch 1 "
    "--global-batch 32 "
    "--offload activations --flash-attention",
};

}  // namespace

BOOST_AUTO_TEST_CASE(json_is_bit_identical_for_any_process_count) {
  for (const char* plan : kPlans) {
    int rc = 0;
    const std::string one = run(bin() + " simulate " + plan + " --json", &rc);
    BOOST_REQUIRE_MESSAGE(rc == 0, plan);
    BOOST_REQUIRE(one.find("iteration_time_s") != std::string::npos);
    for (int np : {2, 4}) {
      const std::string many = run(mpi(np) + bin() + " simulate " + plan + " --json", &rc);
      BOOST_TEST_CONTEXT("-np " << np << " " << plan) {
        BOOST_TEST(rc == 0);
        BOOST_TEST(many == one);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(mirror_runs_every_rank_in_its_own_process) {
  const std::string plan =
      "--model gpt2-124m --cluster dgx-a100-80g --nodes 1 --tp 2 --pp 2 --dp 2 --micro-batch 1 "
      "--global-batch 8";
  int rc = 0;
  // A mirror run simulates every rank: the same as --full on one process.
  const std::string one = run(bin() + " simulate " + plan + " --json --full", &rc);
  BOOST_REQUIRE(rc == 0);
  const std::string mirror = run(mpi(8) + bin() + " simulate " + plan + " --json --mirror", &rc);
  BOOST_TEST(rc == 0);
  BOOST_TEST(mirror == one);
  // The world must match the plan.
  run(mpi(2) + bin() + " simulate " + plan + " --json --mirror", &rc);
  BOOST_TEST(rc == 2);
}

BOOST_AUTO_TEST_CASE(trace_is_the_same_for_any_process_count) {
  const fs::path dir =
      fs::temp_directory_path() / ("stratagem_sim_mpi_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string plan = kPlans[4];
  std::string ref;
  for (int np : {1, 3}) {
    const std::string h5 = (dir / ("t" + std::to_string(np) + ".h5")).string();
    const std::string js = (dir / ("t" + std::to_string(np) + ".json")).string();
    int rc = 0;
    run((np > 1 ? mpi(np) : ""s) + bin() + " simulate " + plan + " --trace " + h5, &rc);
    BOOST_REQUIRE(rc == 0);
    run(bin() + " trace export " + h5 + " --chrome " + js, &rc);
    BOOST_REQUIRE(rc == 0);
    const std::string text = slurp(js);
    BOOST_TEST(text.size() > 1000u);
    if (np == 1)
      ref = text;
    else
      BOOST_TEST(text == ref);
  }
  fs::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(symmetric_trace_equals_full_trace) {
  // Symmetric plans (one representative per stage): the trace copies each representative's
  // spans and memory to the ranks it stands for, the same file as simulating every rank.
  const fs::path dir =
      fs::temp_directory_path() / ("stratagem_sim_sym_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* plan : {kPlans[0], kPlans[3]}) {
    std::string ref;
    for (const char* mode : {"full1", "sym1", "sym2"}) {
      const std::string h5 = (dir / (std::string(mode) + ".h5")).string();
      const std::string js = (dir / (std::string(mode) + ".json")).string();
      const bool full = mode[1] == 'u', np2 = mode[3] == '2';
      int rc = 0;
      const std::string out = run((np2 ? mpi(2) : ""s) + bin() + " simulate " + plan +
                                      (full ? " --full" : "") + " --trace " + h5,
                                  &rc);
      BOOST_REQUIRE(rc == 0);
      BOOST_TEST((out.find("mode: symmetric") != std::string::npos) == !full);
      run(bin() + " trace export " + h5 + " --chrome " + js, &rc);
      BOOST_REQUIRE(rc == 0);
      const std::string text = slurp(js);
      BOOST_TEST_CONTEXT(plan << " " << mode) {
        BOOST_TEST(text.size() > 1000u);
        if (full)
          ref = text;
        else
          BOOST_TEST(text == ref);
      }
    }
  }
  fs::remove_all(dir);
}
