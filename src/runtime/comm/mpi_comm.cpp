#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "src/runtime/comm/mpi_progress.hpp"
#include "stratagem/comm.hpp"
#include "stratagem/watchdog.hpp"

// One checked-call macro for MPI, reporting file and line.
#define STRATAGEM_MPI_CHECK(call)                                                       \
  do {                                                                                  \
    int rc_ = (call);                                                                   \
    if (rc_ != MPI_SUCCESS) {                                                           \
      char msg_[MPI_MAX_ERROR_STRING];                                                  \
      int len_ = 0;                                                                     \
      MPI_Error_string(rc_, msg_, &len_);                                               \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + \
                               ": " #call ": " + std::string(msg_, len_));              \
    }                                                                                   \
  } while (0)

namespace stratagem {
namespace {

// MPI counts are int; large buffers go in chunks.
constexpr int64_t kMaxChunk = 1 << 30;

int checked_count(int64_t n, const char* what) {
  if (n < 0 || n > kMaxChunk)
    throw std::runtime_error(std::string(what) + ": " + std::to_string(n) +
                             " elements do not fit one MPI call");
  return static_cast<int>(n);
}

// MPI requests of one transfer. wait() polls so that a peer that never arrives becomes an
// error after the timeout instead of a hang.
class MpiRequest final : public Request {
 public:
  MpiRequest(std::string what, std::string absent, double timeout_s)
      : what_(std::move(what)),
        absent_(std::move(absent)),
        timeout_s_(timeout_s),
        progress_ticket_(comm_detail::progress_begin()) {}
  std::vector<MPI_Request> requests;
  std::vector<int> counts, displs;  // count arrays of v-collectives, alive until completion
  std::vector<int> recv_counts, recv_displs;  // an all-to-all's receiving side
  void wait() override {
    if (requests.empty()) return landed();
    if (timeout_s_ <= 0) {
      STRATAGEM_MPI_CHECK(MPI_Waitall(int(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
      requests.clear();
      landed();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    int done = 0;
    for (int spins = 0;; ++spins) {
      STRATAGEM_MPI_CHECK(
          MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
      if (done) break;
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > timeout_s_)
        throw CommTimeout(what_ + " waited " + std::to_string(int(waited)) +
                          " s (--comm-timeout-s): not arrived: " + absent_ + " (stopped or died)");
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    requests.clear();
    landed();
  }
  bool test() override {
    if (requests.empty()) return landed(), true;
    int done = 0;
    STRATAGEM_MPI_CHECK(
        MPI_Testall(int(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
    if (done) requests.clear(), landed();
    return done != 0;
  }
  ~MpiRequest() override {
    landed();
    // An unfinished transfer at destruction is an error path. While an error unwinds the job
    // is about to be aborted: freeing a pending collective's request is erroneous in MPI and
    // would abort before the error is reported, so it is left alone.
    if (std::uncaught_exceptions() > 0) return;
    for (MPI_Request& r : requests)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
  }

 private:
  void landed() { comm_detail::progress_end(std::exchange(progress_ticket_, 0)); }
  std::string what_, absent_;
  double timeout_s_;
  uint64_t progress_ticket_;  // handed back once, when the transfer lands or goes
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm c, std::string name, double timeout_s)
      : comm_(c), name_(std::move(name)), timeout_s_(timeout_s) {
    MPI_Comm_rank(c, &rank_);
    MPI_Comm_size(c, &size_);
    // World ranks of the members, for messages.
    MPI_Group group, world;
    MPI_Comm_group(c, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> local(size_);
    for (int i = 0; i < size_; ++i) local[i] = i;
    world_of_.resize(size_);
    MPI_Group_translate_ranks(group, size_, local.data(), world, world_of_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
  }

  RequestPtr iall_reduce(float* data, int64_t count, ReduceOp op) override {
    auto r = request("all-reduce");
    for (int64_t at = 0; at < count; at += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - at));
      r->requests.emplace_back();
      STRATAGEM_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data + at, n, MPI_FLOAT,
                                         op == ReduceOp::sum ? MPI_SUM : MPI_MAX, comm_,
                                         &r->requests.back()));
    }
    return r;
  }
  RequestPtr ireduce_scatter(const float* send, float* recv, int64_t block) override {
    auto r = request("reduce-scatter");
    r->requests.emplace_back();
    STRATAGEM_MPI_CHECK(MPI_Ireduce_scatter_block(send, recv,
                                                  checked_count(block, "reduce-scatter"), MPI_FLOAT,
                                                  MPI_SUM, comm_, &r->requests.back()));
    return r;
  }
  RequestPtr iall_gather(const float* send, float* recv, int64_t block) override {
    auto r = request("all-gather");
    const int n = checked_count(block, "all-gather");
    r->requests.emplace_back();
    STRATAGEM_MPI_CHECK(
        MPI_Iallgather(send, n, MPI_FLOAT, recv, n, MPI_FLOAT, comm_, &r->requests.back()));
    return r;
  }
  RequestPtr ireduce_scatter_v(const float* send, float* recv,
                               const std::vector<int64_t>& counts) override {
    auto r = request("reduce-scatter");
    r->counts = to_int(counts);
    r->requests.emplace_back();
    STRATAGEM_MPI_CHECK(MPI_Ireduce_scatter(send, recv, r->counts.data(), MPI_FLOAT, MPI_SUM, comm_,
                                            &r->requests.back()));
    return r;
  }
  RequestPtr iall_gather_v_inplace(float* buf, const std::vector<int64_t>& counts) override {
    auto r = request("all-gather");
    // MPI reads the count arrays until the operation completes: the request keeps them.
    r->counts = to_int(counts);
    r->displs.assign(r->counts.size(), 0);
    for (size_t i = 1; i < r->counts.size(); ++i)
      r->displs[i] = r->displs[i - 1] + r->counts[i - 1];
    r->requests.emplace_back();
    STRATAGEM_MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, r->counts.data(),
                                        r->displs.data(), MPI_FLOAT, comm_, &r->requests.back()));
    return r;
  }
  RequestPtr isend(const float* data, int64_t count, int peer, int tag) override {
    auto r = request("send to rank " + std::to_string(world_of_.at(peer)), peer);
    r->requests.emplace_back();
    STRATAGEM_MPI_CHECK(MPI_Isend(data, checked_count(count, "send"), MPI_FLOAT, peer, tag, comm_,
                                  &r->requests.back()));
    return r;
  }
  RequestPtr irecv(float* data, int64_t count, int peer, int tag) override {
    auto r = request("receive from rank " + std::to_string(world_of_.at(peer)), peer);
    r->requests.emplace_back();
    STRATAGEM_MPI_CHECK(MPI_Irecv(data, checked_count(count, "receive"), MPI_FLOAT, peer, tag,
                                  comm_, &r->requests.back()));
    return r;
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, int64_t count) override {
    reduce(data, count, MPI_FLOAT, MPI_SUM);
  }
  void all_reduce_sum(double* data, int64_t count) override {
    reduce(data, count, MPI_DOUBLE, MPI_SUM);
  }
  void all_reduce_max(double* data, int64_t count) override {
    reduce(data, count, MPI_DOUBLE, MPI_MAX);
  }

  void reduce_scatter_sum_v(const float* send, float* recv,
                            const std::vector<int64_t>& counts) override {
    std::vector<int> c = to_int(counts);
    WatchdogScope watch = guard("reduce-scatter");
    STRATAGEM_MPI_CHECK(MPI_Reduce_scatter(send, recv, c.data(), MPI_FLOAT, MPI_SUM, comm_));
  }
  void all_gather_v_inplace(float* buf, const std::vector<int64_t>& counts) override {
    std::vector<int> c = to_int(counts), displs(c.size(), 0);
    for (size_t i = 1; i < c.size(); ++i) displs[i] = displs[i - 1] + c[i - 1];
    WatchdogScope watch = guard("all-gather");
    STRATAGEM_MPI_CHECK(
        MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, c.data(), displs.data(), MPI_FLOAT, comm_));
  }
  void all_to_all_counts(const int64_t* send, int64_t* recv, int64_t per_member) override {
    WatchdogScope watch = guard("all-to-all");
    STRATAGEM_MPI_CHECK(MPI_Alltoall(send, int(per_member), MPI_INT64_T, recv, int(per_member),
                                     MPI_INT64_T, comm_));
  }
  RequestPtr iall_to_all_v(const float* send, const std::vector<int64_t>& send_counts, float* recv,
                           const std::vector<int64_t>& recv_counts) override {
    auto r = request("all-to-all");
    // MPI reads the count arrays until the operation completes: the request keeps them.
    auto displs = [](const std::vector<int>& c) {
      std::vector<int> d(c.size(), 0);
      for (size_t i = 1; i < c.size(); ++i) d[i] = d[i - 1] + c[i - 1];
      return d;
    };
    r->counts = to_int(send_counts);
    r->displs = displs(r->counts);
    r->recv_counts = to_int(recv_counts);
    r->recv_displs = displs(r->recv_counts);
    r->requests.emplace_back();
    STRATAGEM_MPI_CHECK(MPI_Ialltoallv(send, r->counts.data(), r->displs.data(), MPI_FLOAT, recv,
                                       r->recv_counts.data(), r->recv_displs.data(), MPI_FLOAT,
                                       comm_, &r->requests.back()));
    return r;
  }
  void barrier() override {
    WatchdogScope watch = guard("barrier");
    STRATAGEM_MPI_CHECK(MPI_Barrier(comm_));
  }

 private:
  static std::vector<int> to_int(const std::vector<int64_t>& v) {
    std::vector<int> out;
    int64_t total = 0;
    for (int64_t x : v) out.push_back(static_cast<int>(x)), total += x;
    if (total > kMaxChunk)
      throw std::runtime_error("collective: buffer too large for one MPI call");
    return out;
  }
  std::string describe(const std::string& op) const {
    return op + " on group " + name_ + " (" + std::to_string(size_) + " ranks)";
  }
  // `peer`: the member a point-to-point transfer waits for; -1 for a collective, which waits
  // for all others (MPI does not tell which of them are missing).
  // Who a wait is for: `peer` for a point-to-point transfer; -1 for a collective, which waits
  // for all others (MPI does not tell which of them are missing).
  std::string absent(int peer = -1) const {
    if (peer >= 0) return "rank " + std::to_string(world_of_[peer]);
    std::vector<int> others;
    for (int i = 0; i < size_; ++i)
      if (i != rank_) others.push_back(world_of_[i]);
    if (others.size() == 1) return "rank " + std::to_string(others[0]);
    std::string out = "one or more of ranks ";
    for (size_t i = 0; i < others.size(); ++i) out += (i ? "," : "") + std::to_string(others[i]);
    return out;
  }
  std::unique_ptr<MpiRequest> request(const std::string& op, int peer = -1) const {
    return std::make_unique<MpiRequest>(describe(op), absent(peer), timeout_s_);
  }
  // Guards a blocking collective, naming who did not arrive as a timed-out request does.
  WatchdogScope guard(const std::string& op) const {
    return WatchdogScope(describe(op), "not arrived: " + absent() + " (stopped or died)");
  }
  template <class T>
  void reduce(T* data, int64_t count, MPI_Datatype type, MPI_Op op) {
    WatchdogScope watch = guard("all-reduce");
    for (int64_t at = 0; at < count; at += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - at));
      STRATAGEM_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data + at, n, type, op, comm_));
    }
  }
  MPI_Comm comm_;
  std::vector<int> world_of_;  // world rank of each member
  std::string name_;
  double timeout_s_ = 0;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name,
                                                    double timeout_s) {
  return std::make_unique<MpiCommunicator>(comm, std::move(name), timeout_s);
}

MpiGroups::MpiGroups(MPI_Comm world, const std::vector<std::vector<int>>& groups) {
  int me = 0;
  MPI_Comm_rank(world, &me);
  for (const auto& g : groups) {
    int pos = -1;
    for (size_t i = 0; i < g.size(); ++i)
      if (g[i] == me) pos = static_cast<int>(i);
    MPI_Comm c = MPI_COMM_NULL;
    // Members get color 0 ordered by their position in the group; others opt out.
    STRATAGEM_MPI_CHECK(MPI_Comm_split(world, pos >= 0 ? 0 : MPI_UNDEFINED, pos, &c));
    comms_.push_back(c);
  }
}

MpiGroups::~MpiGroups() {
  for (MPI_Comm& c : comms_)
    if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
}

}  // namespace stratagem
