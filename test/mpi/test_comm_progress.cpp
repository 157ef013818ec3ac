// The MPI communicator's transfers move on while every rank computes (src/runtime/comm/
// mpi_progress.hpp): a 16 MB all-reduce issued before 300 ms without a single MPI call has
// landed by the first test() after them. A ring over 2 ranks needs each rank's progress for
// each of its rounds, and Open MPI's shared-memory transport moves a large message in
// fragments only when the receiver enters MPI, so without the progress thread it has not.
#define BOOST_TEST_MODULE comm_progress
#include <mpi.h>

#include <boost/test/unit_test.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "stratagem/comm.hpp"

namespace {
struct MpiThreads {
  MpiThreads() {
    int level = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &level);
    provided = level;
  }
  ~MpiThreads() { MPI_Finalize(); }
  static inline int provided = 0;
};
BOOST_TEST_GLOBAL_FIXTURE(MpiThreads);

// Issues the all-reduce, computes without MPI for 300 ms, and says whether it landed then.
bool landed_during_compute(stratagem::Communicator& comm) {
  std::vector<float> data(size_t(4) << 20, float(comm.rank() + 1));  // 16 MB
  comm.barrier();
  stratagem::RequestPtr r =
      comm.iall_reduce(data.data(), int64_t(data.size()), stratagem::ReduceOp::sum);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  volatile double sink = 0;
  while (std::chrono::steady_clock::now() < until) sink = sink + 1.0;  // no MPI call
  const bool done = r->test();
  r->wait();
  const float expect = float(comm.size() * (comm.size() + 1) / 2);
  BOOST_TEST(data.front() == expect);
  BOOST_TEST(data.back() == expect);
  comm.barrier();
  return done;
}
}  // namespace

BOOST_AUTO_TEST_CASE(transfers_move_on_while_the_rank_computes) {
  BOOST_REQUIRE_MESSAGE(MpiThreads::provided == MPI_THREAD_MULTIPLE,
                        "Open MPI gave no MPI_THREAD_MULTIPLE: no progress thread");
  auto comm = stratagem::make_mpi_communicator(MPI_COMM_WORLD);
  // Without the thread (printed: whether it lands is up to the MPI library's eager sizes).
  const bool alone = landed_during_compute(*comm);
  BOOST_TEST_MESSAGE("without the progress thread: " << (alone ? "landed" : "not landed"));
  stratagem::start_mpi_progress();
  const bool with_thread = landed_during_compute(*comm);
  stratagem::stop_mpi_progress();
  BOOST_TEST(with_thread);
}
