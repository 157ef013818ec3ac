// The published small jobs on one node (data/calibration/small-jobs.json): 125M-1.3B GPT
// models on 8 GPUs of one node at tp 1-8 (MosaicML and llm.c at tp 1, the Ultra-Scale
// Playbook's nanotron runs at tp 1-8), in the schema of the H100 file, built as (model,
// cluster, framework, plan) rows by the same loader.
#pragma once
#include <string>
#include <vector>

#include "test/calibration/h100_rows.hpp"

namespace stratagem::calibration {

inline std::string small_jobs_file() {
  return std::string(STRATAGEM_SOURCE_DIR) + "/data/calibration/small-jobs.json";
}

inline std::vector<H100Row> load_small_job_rows() {
  return load_h100_rows(small_jobs_file());
}

// Signed errors of a file's forecasts: the MAPE, and how many rows were fast and slow (a
// model fast, or slow, on every row has a missing term, whatever its mean).
struct ErrorTally {
  double abs_sum = 0;
  int n = 0, fast = 0, slow = 0;
  void add(double err) {
    abs_sum += err < 0 ? -err : err, ++n;
    fast += err<0, slow += err> 0;
  }
  double mape() const { return n > 0 ? abs_sum / n : 0; }
};

}  // namespace stratagem::calibration
