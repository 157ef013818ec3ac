// Shared by the simulator's MPI tests: MPI set-up as a Boost global fixture, this process's
// rank, and the check that two runs gave a rank the same results.
#pragma once
#include <mpi.h>

#include <boost/test/unit_test.hpp>

#include "stratagem/simulate.hpp"

namespace stratagem::test {

struct MpiWorld {
  MpiWorld() { MPI_Init(nullptr, nullptr); }
  ~MpiWorld() { MPI_Finalize(); }
};

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Every figure a run reports for a rank, exactly.
inline void same_rank_results(const SimRankResult& a, const SimRankResult& b) {
  BOOST_TEST(a.rank == b.rank);
  BOOST_TEST(a.stage == b.stage);
  BOOST_TEST(a.peak_memory_bytes == b.peak_memory_bytes);
  BOOST_TEST(a.peak_allocated_bytes == b.peak_allocated_bytes);
  BOOST_TEST(a.peak_op == b.peak_op);
  BOOST_TEST(a.peak_time_ns == b.peak_time_ns);
  BOOST_TEST(a.end_ns == b.end_ns);
  BOOST_TEST(a.compute_ns == b.compute_ns);
  BOOST_TEST(a.recompute_ns == b.recompute_ns);
  BOOST_TEST(a.tp_ns == b.tp_ns);
  BOOST_TEST(a.dp_ns == b.dp_ns);
  BOOST_TEST(a.pp_ns == b.pp_ns);
  BOOST_TEST(a.bubble_ns == b.bubble_ns);
  BOOST_TEST(a.offload_ns == b.offload_ns);
  BOOST_TEST(a.ops_executed == b.ops_executed);
}

}  // namespace stratagem::test
