// The one rule for outputs (stratagem/output_file.hpp, issue 30): regular files only, nothing
// half-written under the name, and write errors that say what failed. The full-disk path of
// every command is tested on a real full tmpfs by test/reliability/disk_full.sh.
#define BOOST_TEST_MODULE output_file
#include <sys/stat.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "src/io/checkpoint_files.hpp"
#include "stratagem/checkpoint.hpp"
#include "stratagem/error.hpp"
#include "stratagem/output_file.hpp"
#include "test/support/input_error.hpp"

using namespace stratagem;
namespace fs = std::filesystem;

namespace {
struct Tmp {
  fs::path dir = fs::temp_directory_path() / ("stratagem_output_" + std::to_string(::getpid()));
  Tmp() { fs::create_directories(dir); }
  ~Tmp() { fs::remove_all(dir); }
  std::string operator()(const std::string& name) const { return (dir / name).string(); }
  size_t entries() const { return size_t(std::distance(fs::directory_iterator(dir), {})); }
};
std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
using stratagem::test::input_error;
}  // namespace

BOOST_AUTO_TEST_CASE(refuses_what_is_not_a_regular_file) {
  Tmp t;
  BOOST_REQUIRE_EQUAL(::mkfifo(t("fifo").c_str(), 0644), 0);
  auto fifo = input_error([&] { io::OutputFile out("-o", t("fifo")); });
  BOOST_TEST(fifo.find("-o " + t("fifo") + ": is not a regular file") != std::string::npos, fifo);
  BOOST_TEST(fs::is_fifo(t("fifo")));
  auto dir = input_error([&] { io::check_output_path("--trace", t.dir.string()); });
  BOOST_TEST(dir.find("is a directory") != std::string::npos, dir);
  auto missing = input_error([&] { io::check_output_path("-o", t("none/x.json")); });
  BOOST_TEST(missing.find("directory " + t("none") + " does not exist") != std::string::npos,
             missing);
  auto empty = input_error([&] { io::check_output_path("--trace", ""); });
  BOOST_TEST(empty == "--trace: expected a file name, got an empty one");
  BOOST_TEST(input_error([&] { io::check_output_path("-o", t("new.json")); }).empty());
}

BOOST_AUTO_TEST_CASE(replace_publishes_only_on_commit) {
  Tmp t;
  {
    io::OutputFile out("-o", t("a.txt"));
    std::fprintf(out.stream(), "half");
  }  // no commit: nothing under the name, no temporary left
  BOOST_TEST(!fs::exists(t("a.txt")));
  BOOST_TEST(t.entries() == 0u);
  io::write_output("-o", t("a.txt"), "first\n");
  io::write_output("-o", t("a.txt"), "second\n");
  BOOST_TEST(read(t("a.txt")) == "second\n");
  BOOST_TEST(t.entries() == 1u);
}

BOOST_AUTO_TEST_CASE(append_and_truncate_write_in_place) {
  Tmp t;
  {
    io::OutputFile log("--log-json", t("log"), io::OutputFile::Mode::truncate);
    log.write("1\n");
    log.flush();
    BOOST_TEST(read(t("log")) == "1\n");  // visible while the run goes on
    log.commit();
  }
  {
    io::OutputFile log("--log-json", t("log"), io::OutputFile::Mode::append);
    log.write("2\n");
    log.commit();
  }
  BOOST_TEST(read(t("log")) == "1\n2\n");
}

BOOST_AUTO_TEST_CASE(write_errors_name_the_file_and_a_full_disk) {
  auto message = [](int err) {
    try {
      io::throw_write_error("-o", "/tmp/x.bin", err);
    } catch (const InputError&) {
      return std::string("InputError");  // a full disk is a failure (exit 1), not bad input
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  BOOST_TEST(message(ENOSPC) == "-o /tmp/x.bin: no space left on device");
  BOOST_TEST(message(EDQUOT) == "-o /tmp/x.bin: no space left on device (disk quota exceeded)");
  BOOST_TEST(message(EIO).find("-o /tmp/x.bin: write failed (") == 0u, message(EIO));
  Tmp t;
  BOOST_TEST(!io::no_space_left(t("x"), 1));
  BOOST_TEST(io::no_space_left(t("x"), uint64_t(1) << 62));  // more than any disk holds
}

// Issue 41: --keep and --resume took checkpoints in file-name order, in which step-100000000.h5
// sorts before step-99999999.h5 (9 digits against 8): rotation deleted the newest and --resume
// took an older one. The order is the step's integer.
BOOST_AUTO_TEST_CASE(checkpoints_are_ordered_by_step_not_by_name) {
  Tmp t;
  for (const char* name :
       {"step-100000001.h5", "step-99999998.h5", "step-100000000.h5", "step-99999999.h5",
        "step-00000007.h5", "step-1000000000000000000000.h5"})
    std::ofstream(t(name)) << "x";
  std::vector<std::string> names;
  for (const auto& path : list_checkpoints(t.dir.string()))
    names.push_back(fs::path(path).filename().string());
  const std::vector<std::string> expected = {"step-00000007.h5",  "step-99999998.h5",
                                             "step-99999999.h5",  "step-100000000.h5",
                                             "step-100000001.h5", "step-1000000000000000000000.h5"};
  BOOST_TEST(names == expected, boost::test_tools::per_element());
  BOOST_TEST(io::checkpoint_step_before("d/step-9.h5", "d/step-00000010.h5"));
  BOOST_TEST(!io::checkpoint_step_before("d/step-00000010.h5", "d/step-9.h5"));
}
