#include "src/runtime/arrival_allreduce.hpp"

#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace stratagem {

namespace {
constexpr int kArrivalTag = 7301;

// Rank 0's list of the members whose arrival it has not received (recvs[i] is rank i + 1's).
std::string late_ranks(std::vector<MPI_Request>& recvs) {
  std::string out;
  int count = 0;
  for (size_t i = 0; i < recvs.size(); ++i) {
    int done = 0;
    if (recvs[i] != MPI_REQUEST_NULL) MPI_Test(&recvs[i], &done, MPI_STATUS_IGNORE);
    if (recvs[i] == MPI_REQUEST_NULL || done) continue;
    out += (count++ ? "," : "") + std::to_string(i + 1);
  }
  if (count == 0) return "every rank reported its arrival, yet the all-reduce did not complete";
  return (count == 1 ? "not arrived: rank " : "not arrived: ranks ") + out + " (stopped or died)";
}
}  // namespace

int allreduce_max_naming_late(MPI_Comm comm, int value, const std::string& what, double timeout_s) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int result = value, token = 1;
  std::vector<int> tokens(size > 1 && rank == 0 ? size - 1 : 0);
  std::vector<MPI_Request> recvs(tokens.size(), MPI_REQUEST_NULL);
  MPI_Request sent = MPI_REQUEST_NULL, reduced = MPI_REQUEST_NULL;
  if (rank == 0)
    for (int r = 1; r < size; ++r)
      MPI_Irecv(&tokens[r - 1], 1, MPI_INT, r, kArrivalTag, comm, &recvs[r - 1]);
  else
    MPI_Isend(&token, 1, MPI_INT, 0, kArrivalTag, comm, &sent);
  MPI_Iallreduce(&value, &result, 1, MPI_INT, MPI_MAX, comm, &reduced);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    int done = 0;
    MPI_Test(&reduced, &done, MPI_STATUS_IGNORE);
    if (done) break;
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (timeout_s > 0 && waited > timeout_s)
      throw std::runtime_error(
          what + " waited " + std::to_string(int(waited)) + " s (--comm-timeout-s): " +
          (rank == 0 ? late_ranks(recvs)
                     : std::string("rank 0 did not complete it (rank 0 names who is late)")));
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // Everyone arrived: the arrival messages have all been sent, so these complete.
  MPI_Waitall(int(recvs.size()), recvs.data(), MPI_STATUSES_IGNORE);
  MPI_Wait(&sent, MPI_STATUS_IGNORE);
  return result;
}

}  // namespace stratagem
