// Profile: measure what one node achieves with the runtime's own kernels and collectives, and
// fit the cluster file's calibration fields (GEMM efficiency curve, attention efficiency,
// achieved memory bandwidth, launch overhead, intra-node collective latency, bandwidth and
// ramp, host<->device copies) so that the cost model reproduces the measurements.
//
// The fit calls the one CostModel with candidate figures; it never restates a cost formula.
// What a single node cannot measure (NICs, the network, host FLOP/s) keeps the file's values,
// and the profile section of the written cluster file lists which fields were measured.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "stratagem/backend.hpp"
#include "stratagem/cluster.hpp"
#include "stratagem/comm.hpp"

namespace stratagem {

struct ProfileOptions {
  bool quick = false;             // fewer shapes and sizes, shorter repetitions (tests, CI)
  double min_time_s = 0.1;        // each measurement repeats until it has run this long
  double max_shape_time_s = 0.5;  // skip a shape the base cluster predicts slower than this
  // Progress lines ("profile: gemm 3/12 ...") go to stderr on rank 0 when set.
  bool progress = true;
};

// One GEMM of the backend's matmul_forward: out (m,n) = inp (m,k) @ weight (n,k)^T.
struct GemmSample {
  int64_t m = 0, n = 0, k = 0;
  double time_s = 0;  // mean over repetitions, slowest rank
};
// Causal attention core, forward + backward, of (batch, seq, heads, head_dim).
struct AttentionSample {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  bool probabilities_kept = false;  // true: standard kernel; false: flash-style recompute
  double time_s = 0;
};
struct StreamSample {
  int64_t bytes = 0;  // bytes read + written by out = a + b
  double time_s = 0;
};
struct CollectiveSample {
  int64_t bytes = 0;  // all-reduce buffer
  double time_s = 0;
};
struct CopySample {
  int64_t bytes = 0;  // one host -> device upload plus one device -> host download of `bytes`
  double time_s = 0;
};

struct ProfileMeasurements {
  std::string backend;
  std::string compute_dtype = "fp32";
  int ranks = 1;  // ranks measured at once (one per device of the node)
  int threads_per_rank = 1;
  double launch_s = 0;  // one tiny kernel, dispatch to completion
  std::vector<GemmSample> gemm;
  std::vector<AttentionSample> attention;
  std::vector<StreamSample> stream;
  std::vector<CollectiveSample> all_reduce;  // empty with one rank
  std::vector<CopySample> copy;
};

// Runs every measurement on all ranks of `comm` at once (they share the node as training
// does); each figure is the slowest rank's median. Collective over `comm`.
ProfileMeasurements measure_profile(Backend& backend, Communicator& comm,
                                    const ProfileOptions& opt);

// How far the cost model is from the measurements, per sample kind: 100 (exp(mean |ln(model /
// measured)|) - 1), the typical miss in percent whichever side it falls on.
struct FitQuality {
  double gemm_error_pct = 0, attention_error_pct = 0, stream_error_pct = 0,
         all_reduce_error_pct = 0, copy_error_pct = 0;
};

struct ProfileFit {
  ClusterSpec base;                       // the file the measurement started from
  ClusterSpec cluster;                    // base with the measured fields replaced
  FitQuality before, after;               // the base file's figures vs the fitted ones
  std::vector<std::string> measured;      // cluster fields set from measurements
  std::vector<std::string> not_measured;  // with the reason
  std::vector<std::string> adjusted;      // datasheet figures the measurements exceeded
};

// What the cost model on cluster `c` predicts for one sample (the fit minimizes the log ratio of
// these to the measurements).
double predicted_time_s(const ClusterSpec& c, const ProfileMeasurements& m, const GemmSample& s);
double predicted_time_s(const ClusterSpec& c, const ProfileMeasurements& m,
                        const AttentionSample& s);
double predicted_time_s(const ClusterSpec& c, const ProfileMeasurements& m, const StreamSample& s);
double predicted_time_s(const ClusterSpec& c, const ProfileMeasurements& m,
                        const CollectiveSample& s);
double predicted_time_s(const ClusterSpec& c, const ProfileMeasurements& m, const CopySample& s);

// Fits base's calibration fields to the measurements. Pure: no MPI, no timing.
ProfileFit fit_profile(const ClusterSpec& base, const ProfileMeasurements& m);
FitQuality fit_quality(const ClusterSpec& c, const ProfileMeasurements& m);

// The cluster file to write: to_json(fit.cluster) plus a "profile" section (provenance, the raw
// samples with before/after predictions, fit errors, measured and not-measured fields).
nlohmann::json profile_cluster_json(const ProfileFit& fit, const ProfileMeasurements& m,
                                    const std::string& base_source);

}  // namespace stratagem
