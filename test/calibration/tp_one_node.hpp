// Published runs with tensor parallelism inside one node (data/calibration/tp-one-node.json):
// Megatron-LM 2019-2022 on V100 and the Ultra-Scale Playbook's nanotron runs on 8 H100, in the
// schema of the H100 file, built by the same loader. Reported by bench_calibration per tp
// degree; no test asserts their MAPE yet (issue 29: the cost of tp at small per-rank work is
// not modelled).
#pragma once
#include <string>
#include <vector>

#include "test/calibration/h100_rows.hpp"

namespace stratagem::calibration {

inline std::string tp_one_node_file() {
  return std::string(STRATAGEM_SOURCE_DIR) + "/data/calibration/tp-one-node.json";
}

inline std::vector<H100Row> load_tp_one_node_rows() {
  return load_h100_rows(tp_one_node_file());
}

}  // namespace stratagem::calibration
