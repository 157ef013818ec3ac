// The shared bound of Searcher::run() under MPI (see BoundExchange).
#pragma once
#include <mpi.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "src/search/searcher.hpp"

namespace stratagem::search_detail {

// The shared bound of run(): the processes exchange their top-K (time, plan-key hash) lists in
// a chain of non-blocking all-gathers (every process posts the same sequence; the chain ends
// with the first exchange in which nobody is searching any more). The K-th best distinct plan
// of the union bounds every process's pruning. A hash collision can only merge two plans, which
// loosens the bound: the answer never depends on the process count.
class BoundExchange {
 public:
  struct Entry {
    double time;
    uint64_t hash;
  };
  BoundExchange(MPI_Comm comm, int k) : comm_(comm), k_(k) {
    if (comm_ != MPI_COMM_NULL) {
      MPI_Comm_size(comm_, &procs_);
      send_.resize(size_t(k_) + 1);
      recv_.resize(send_.size() * size_t(procs_));
    }
  }
  double shared() const { return shared_; }
  // Between configurations: take a finished exchange's result and post the next one.
  void poll(const TopK& mine) {
    if (comm_ == MPI_COMM_NULL) return;
    if (req_ == MPI_REQUEST_NULL) return post(mine, true);
    int done = 0;
    MPI_Test(&req_, &done, MPI_STATUS_IGNORE);
    if (done) {
      absorb();
      post(mine, true);
    }
  }
  // After the last configuration: keep exchanging until nobody searches.
  void finish(const TopK& mine) {
    if (comm_ == MPI_COMM_NULL) return;
    if (req_ == MPI_REQUEST_NULL) post(mine, true);
    while (true) {
      MPI_Wait(&req_, MPI_STATUS_IGNORE);
      if (!absorb()) break;
      post(mine, false);
    }
  }

 private:
  void post(const TopK& mine, bool active) {
    std::fill(send_.begin(), send_.end(), Entry{kInf, 0});
    for (size_t i = 0; i < mine.items().size() && i < size_t(k_); ++i)
      send_[i] = {mine.items()[i].est_iteration_time_s,
                  std::hash<std::string>{}(mine.items()[i].key)};
    send_[size_t(k_)] = {active ? 1.0 : 0.0, 0};  // the last entry: still searching?
    const int bytes = int(send_.size() * sizeof(Entry));
    MPI_Iallgather(send_.data(), bytes, MPI_BYTE, recv_.data(), bytes, MPI_BYTE, comm_, &req_);
  }
  // Updates the bound; true when some process is still searching.
  bool absorb() {
    std::vector<Entry> all;
    bool active = false;
    for (int p = 0; p < procs_; ++p) {
      const Entry* e = recv_.data() + size_t(p) * send_.size();
      for (int i = 0; i < k_; ++i)
        if (e[i].time < kInf) all.push_back(e[i]);
      active |= e[k_].time > 0;
    }
    std::sort(all.begin(), all.end(), [](const Entry& a, const Entry& b) {
      return a.hash != b.hash ? a.hash < b.hash : a.time < b.time;
    });
    all.erase(std::unique(all.begin(), all.end(),
                          [](const Entry& a, const Entry& b) { return a.hash == b.hash; }),
              all.end());
    if (int(all.size()) >= k_) {
      std::nth_element(all.begin(), all.begin() + (k_ - 1), all.end(),
                       [](const Entry& a, const Entry& b) { return a.time < b.time; });
      shared_ = std::min(shared_, all[size_t(k_ - 1)].time);
    }
    return active;
  }
  MPI_Comm comm_;
  int k_, procs_ = 1;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::vector<Entry> send_, recv_;
  double shared_ = kInf;
};

}  // namespace stratagem::search_detail
