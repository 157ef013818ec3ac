// What a run with --trace records of the ranks this process simulates: every op's span and every
// memory event, per rank in the order they happen; the report writes them to the trace file
// (report.cpp) once gathered to process 0. Without --trace it records nothing.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "sim/types.hpp"
#include "stratagem/simulate.hpp"

namespace stratagem::sim {

class TraceRecorder {
 public:
  void init(bool enabled, size_t local_ranks) {
    enabled_ = enabled;
    if (!enabled) return;
    op_spans_.assign(local_ranks, {});
    memory_samples_.assign(local_ranks, {});
  }
  void op_done(int local_index, uint32_t op, uint32_t iteration, Time start, Time end) {
    if (enabled_) op_spans_[local_index].push_back({op, iteration, start, end});
  }
  // Where the memory ledger appends a rank's samples (null: not recording).
  std::vector<trace::MemorySample>* memory_of(int local_index) {
    return enabled_ ? &memory_samples_[local_index] : nullptr;
  }
  // Hands the records to the result: `local_ranks` name the rows; in a symmetric run `rep_of`
  // (empty otherwise) tells every rank whose rows it shares.
  void move_into(SimResult& out, const std::vector<int>& local_ranks,
                 const std::vector<int32_t>& rep_of) {
    if (!enabled_) return;
    out.trace_ranks = local_ranks;
    out.trace_rep_of.assign(rep_of.begin(), rep_of.end());
    out.trace_ops = std::move(op_spans_);
    out.trace_memory = std::move(memory_samples_);
  }

 private:
  bool enabled_ = false;
  std::vector<std::vector<SimOpSpan>> op_spans_;                  // [local index]
  std::vector<std::vector<trace::MemorySample>> memory_samples_;  // [local index]
};

}  // namespace stratagem::sim
