// Published runs with tensor parallelism inside one node on V100 (data/calibration/
// tp-one-node.json): Megatron-LM 2019-2022, in the schema of the H100 file, built by the same
// loader. Reported by bench_calibration per tp degree; no test asserts their MAPE: the V100
// cluster file's efficiencies are the A100 file's (no V100 source), and the 2019 code's
// strong-scaling loss at tp 2-8 is not identified (data/calibration/README.md).
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
