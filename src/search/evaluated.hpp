// The record of every plan the search scored, for the search front of `stratagem report`
// (`evaluated_candidates` in the search JSON). Its memory is bounded however many plans the
// search scores: it keeps a uniform sample of at most kEvaluatedSampleCap plans (those with the
// smallest hash of their figures: order-independent, so the MPI processes' samples merge into
// the sample of the union) plus the Pareto front of throughput against peak memory. Plans with
// identical figures are recorded once. A plan's description is built only when it is kept.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "stratagem/search.hpp"

namespace stratagem::search_detail {

class EvaluatedLog {
 public:
  // Cheap unless the plan enters the sample or the front (then describe() runs once).
  void record(const Plan& p, double iteration_time_s, double tokens_per_s, int64_t peak_bytes,
              const char* origin);
  void record(const EvaluatedPlan& e);  // merging another process's log
  // Sample and front together, by peak memory then throughput (descending); deterministic.
  std::vector<EvaluatedPlan> plans() const;

 private:
  static uint64_t hash_of(double time_s, double tokens, int64_t peak);
  bool on_front(int64_t peak, double tokens) const;
  void add_to_front(const EvaluatedPlan& e);
  std::map<uint64_t, EvaluatedPlan> sample_;  // by figure hash, smallest kept
  std::map<int64_t, EvaluatedPlan> front_;    // by peak; throughput rises with peak
};

}  // namespace stratagem::search_detail
