// Communication requests: the transfers this rank has issued and not yet completed
// (collectives, sends, receives, and the copy streams' work), each with what runs when it
// lands.
#pragma once
#include <cstddef>
#include <functional>
#include <map>

#include "stratagem/comm.hpp"

namespace stratagem::exec {

struct Requests {
  struct InFlight {
    RequestPtr request;
    std::function<void()> on_done;
  };
  std::map<int, InFlight> in_flight;  // op index -> transfer not yet completed
  std::map<int, size_t> timing_slot;  // async op -> its entry in the step's timings
  int last_dp_reduce = -1;            // the dp reduce-scatter in flight (the dp stream is in order)

  void issue(int op, RequestPtr request, std::function<void()> on_done = {}) {
    in_flight[op] = InFlight{std::move(request), std::move(on_done)};
  }
  // Not in flight, or its transfer has landed (tested, not waited).
  bool landed(int op) {
    auto it = in_flight.find(op);
    return it == in_flight.end() || it->second.request->test();
  }
  // Tests every transfer in flight: MPI moves non-blocking transfers on only inside MPI calls.
  void progress() {
    for (auto& [op, f] : in_flight) f.request->test();
  }
};

}  // namespace stratagem::exec
