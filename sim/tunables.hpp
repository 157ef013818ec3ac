// Calibration constants of the discrete-event simulator that are not properties of a cluster
// file. Each one can be overridden per run (SimOptions); the defaults cite their source.
#pragma once

namespace stratagem::sim {

// The slowdown of compute kernels next to communication is a property of the GPU, shared with
// the estimator: gpu.compute_comm_interference in the cluster file (cluster.hpp).

// Fixed-point scales of the integer fluid model (see sim/README.md): a transfer at the full
// speed of its link makes kRateScale units of progress per nanosecond; compute likewise.
inline constexpr long long kRateScale = 1LL << 16;

}  // namespace stratagem::sim
