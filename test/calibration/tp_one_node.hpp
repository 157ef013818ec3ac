// Published Megatron runs with tensor parallelism inside one node
// (data/calibration/tp-one-node.json): Megatron-LM 2019 on 1-8 V100 of a DGX-2H, in the schema of
// the H100 file, built by the same loader. Reported by bench_calibration per tp degree; no test
// asserts their MAPE yet.
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
