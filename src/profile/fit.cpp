// Fitting the cluster file's calibration fields to measured samples. Every prediction comes
// from the CostModel built on a candidate ClusterSpec, so the fitted figures mean exactly what
// the simulator and the estimator will do with them.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "stratagem/cost.hpp"
#include "stratagem/profile.hpp"
#include "stratagem/workload.hpp"

namespace stratagem {
namespace {

// The plan a profile describes: one device computing in the backend's dtype.
Plan profile_plan(const ProfileMeasurements& m, bool flash) {
  Plan p;
  p.dtype = dtype_from_string(m.compute_dtype, "profile compute_dtype");
  p.flash_attention = flash;
  return p;
}

ModelSpec attention_model(const AttentionSample& s) {
  ModelSpec m;
  m.name = "profile-attention";
  m.layers = 1;
  m.heads = int(s.heads);
  m.kv_heads = int(s.heads);
  m.hidden = int(s.heads * s.head_dim);
  m.ffn_hidden = 4 * m.hidden;
  m.seq_len = int(s.seq);
  m.vocab = 1;
  return m;
}

}  // namespace

// Predictions of the one cost model, per sample kind.
double predicted_time_s(const ClusterSpec& c, const ProfileMeasurements& m, const GemmSample& s) {
  static const ModelSpec none;
  const Plan p = profile_plan(m, false);
  const CostModel cm(none, c, p.dtype);
  return cm.gemm_time_s(Gemm{s.m, s.n, s.k}) + c.gpu.kernel_launch_s;
}
double predicted_time_s(const ClusterSpec& c, const ProfileMeasurements& m,
                        const AttentionSample& s) {
  const ModelSpec model = attention_model(s);
  const Plan p = profile_plan(m, !s.probabilities_kept);
  const CostModel cm(model, c, p.dtype);
  LayerStrategy st;
  const BlockWork fwd = attention_core_work(model, st, int(s.batch), p.flash_attention);
  return cm.block_time_s(fwd) + cm.block_time_s(backward_of(fwd));
}
double predicted_time_s(const ClusterSpec& c, const ProfileMeasurements& m, const StreamSample& s) {
  static const ModelSpec none;
  const Plan p = profile_plan(m, false);
  return CostModel(none, c, p.dtype).elementwise_time_s(double(s.bytes)) + c.gpu.kernel_launch_s;
}
double predicted_time_s(const ClusterSpec& c, const ProfileMeasurements& m,
                        const CollectiveSample& s) {
  return FabricModel(c).collective_cost(Collective::all_reduce, s.bytes, m.ranks, 1).time_s();
}
double predicted_time_s(const ClusterSpec& c, const ProfileMeasurements& m, const CopySample& s) {
  (void)m;
  return 2 * FabricModel(c).copy_cost(s.bytes).time_s();  // upload + download
}

namespace {

// Mean |ln(model / measured)|: symmetric in over- and under-prediction, and a 2x miss on a
// 10 us GEMM weighs as much as on a 1 s one. The fit minimizes it; reports show it as the
// equivalent percentage exp(e) - 1.
template <class Sample>
double log_error(const ClusterSpec& c, const ProfileMeasurements& m, const std::vector<Sample>& v) {
  double e = 0;
  for (const auto& s : v)
    e += std::abs(std::log(std::max(predicted_time_s(c, m, s), 1e-30) / s.time_s));
  return e / double(std::max<size_t>(1, v.size()));
}

template <class Sample>
double error_pct(const ClusterSpec& c, const ProfileMeasurements& m, const std::vector<Sample>& v) {
  return v.empty() ? 0 : 100 * (std::exp(log_error(c, m, v)) - 1);
}

// One parameter on [lo, hi] (log-spaced when lo > 0): a coarse grid, then two finer grids
// around the best point. Returns the best x.
double fit_1d(double lo, double hi, const std::function<double(double)>& err) {
  const bool logs = lo > 0;
  auto at = [&](double a, double b, int i, int n) {
    const double t = double(i) / (n - 1);
    return logs ? a * std::pow(b / a, t) : a + (b - a) * t;
  };
  constexpr int n = 41;
  double a = lo, b = hi, best = lo, best_err = std::numeric_limits<double>::infinity();
  for (int round = 0; round < 3; ++round) {
    int bi = 0;
    double round_err = std::numeric_limits<double>::infinity();
    for (int i = 0; i < n; ++i) {
      const double e = err(at(a, b, i, n));
      if (e < round_err) round_err = e, bi = i;
    }
    if (round_err < best_err) best_err = round_err, best = at(a, b, bi, n);
    const double na = at(a, b, std::max(0, bi - 1), n), nb = at(a, b, std::min(n - 1, bi + 1), n);
    a = na, b = nb;
  }
  return best;
}

// Two parameters: for each value of the first, the best second one.
std::pair<double, double> fit_2d(double lo1, double hi1, double lo2, double hi2,
                                 const std::function<double(double, double)>& err) {
  auto inner = [&](double x) { return fit_1d(lo2, hi2, [&](double y) { return err(x, y); }); };
  const double x = fit_1d(lo1, hi1, [&](double a) { return err(a, inner(a)); });
  return {x, inner(x)};
}

double best_gemm_rate(const ProfileMeasurements& m) {
  double r = 0;
  for (const auto& s : m.gemm) r = std::max(r, 2.0 * s.m * s.n * s.k / s.time_s);
  return r;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", v);
  return b;
}

// A fit that does worse than the values it started from is dropped: the file keeps them.
struct GroupGuard {
  ProfileFit& f;
  ClusterSpec start;
  size_t measured_mark, adjusted_mark;
  explicit GroupGuard(ProfileFit& fit)
      : f(fit),
        start(fit.cluster),
        measured_mark(fit.measured.size()),
        adjusted_mark(fit.adjusted.size()) {}
  template <class Sample>
  void keep_if_better(const ProfileMeasurements& m, const std::vector<Sample>& v,
                      const std::string& group) {
    if (v.empty() || log_error(f.cluster, m, v) < log_error(start, m, v)) return;
    f.cluster = start;
    f.measured.resize(measured_mark);
    f.adjusted.resize(adjusted_mark);
    f.not_measured.push_back(group + ": measured, but the file's values fit it as well; kept");
  }
};

}  // namespace

FitQuality fit_quality(const ClusterSpec& c, const ProfileMeasurements& m) {
  FitQuality q;
  q.gemm_error_pct = error_pct(c, m, m.gemm);
  q.attention_error_pct = error_pct(c, m, m.attention);
  q.stream_error_pct = error_pct(c, m, m.stream);
  q.all_reduce_error_pct = error_pct(c, m, m.all_reduce);
  q.copy_error_pct = error_pct(c, m, m.copy);
  return q;
}

namespace {

// Groups whose figures enter other groups' predictions: the launch overhead (GEMM, stream and
// attention), the stream group's memory figures and the GEMM group's peak (attention).
enum Shared : unsigned { kLaunch = 1, kStream = 2, kGemm = 4 };

// The launch overhead, measured directly.
void take_launch(ProfileFit& f, const ProfileMeasurements& m) {
  f.cluster.gpu.kernel_launch_s = m.launch_s;
  f.measured.push_back("gpu.kernel_launch_s");
}

// Memory efficiency from the stream samples.
void fit_stream(ProfileFit& f, const ProfileMeasurements& m) {
  ClusterSpec& c = f.cluster;
  GpuSpec& g = c.gpu;
  GroupGuard guard(f);
  // Achieved bandwidth beyond the datasheet figure means the figure is wrong, not the clock.
  double best = 0;
  for (const auto& s : m.stream)
    best = std::max(best, double(s.bytes) / std::max(1e-12, s.time_s - g.kernel_launch_s));
  if (best > g.hbm_bandwidth_gbps * 1e9) {
    f.adjusted.push_back("gpu.hbm_bandwidth_gbps: " + num(g.hbm_bandwidth_gbps) + " in the file, " +
                         num(best / 1e9) + " measured; set to the measurement");
    g.hbm_bandwidth_gbps = best / 1e9;
  }
  g.memory_efficiency = fit_1d(0.01, 1.0, [&](double x) {
    ClusterSpec t = c;
    t.gpu.memory_efficiency = x;
    return log_error(t, m, m.stream);
  });
  f.measured.push_back("gpu.memory_efficiency");
  guard.keep_if_better(m, m.stream, "gpu.memory_efficiency");
}

// The GEMM efficiency curve (its maximum and its half-efficiency size) from the GEMM samples.
void fit_gemm(ProfileFit& f, const ProfileMeasurements& m, Dtype dt) {
  ClusterSpec& c = f.cluster;
  GpuSpec& g = c.gpu;
  GroupGuard guard(f);
  const double best = best_gemm_rate(m);
  if (best > g.peak_flops(dt)) {
    // The efficiency curve needs headroom above the best shape; 2x keeps max_efficiency
    // inside (0, 1] whatever the size term of that shape is.
    f.adjusted.push_back("gpu.peak_flops." + std::string(to_string(dt)) + ": " +
                         num(g.peak_flops(dt)) + " in the file, " + num(best) +
                         " FLOP/s measured; set to twice the measurement");
    for (double* peak :
         {&g.peak_flops_fp32, &g.peak_flops_tf32, &g.peak_flops_fp16, &g.peak_flops_bf16})
      *peak = std::max(*peak, 2 * best);
  }
  const auto [half, eff] = fit_2d(1e3, 1e13, 0.005, 1.0, [&](double h, double e) {
    ClusterSpec t = c;
    t.gpu.gemm_half_efficiency_flops = h;
    t.gpu.gemm_max_efficiency = e;
    return log_error(t, m, m.gemm);
  });
  g.gemm_half_efficiency_flops = half;
  g.gemm_max_efficiency = eff;
  f.measured.push_back("gpu.gemm.max_efficiency");
  f.measured.push_back("gpu.gemm.half_efficiency_flops");
  guard.keep_if_better(m, m.gemm, "gpu.gemm");
}

// One attention efficiency (`field`, named `name`) from the samples `v` of its kind.
void fit_attention(ProfileFit& f, const ProfileMeasurements& m,
                   const std::vector<AttentionSample>& v, double GpuSpec::*field,
                   const char* name) {
  ClusterSpec& c = f.cluster;
  if (v.empty()) {
    f.not_measured.push_back(std::string(name) + ": no attention sample");
    return;
  }
  GroupGuard guard(f);
  c.gpu.*field = fit_1d(0.001, 1.0, [&](double x) {
    ClusterSpec t = c;
    t.gpu.*field = x;
    return log_error(t, m, v);
  });
  f.measured.push_back(name);
  guard.keep_if_better(m, v, name);
}

// The intra-node link (latency, bus efficiency, bandwidth ramp) from the all-reduce samples.
void fit_all_reduce(ProfileFit& f, const ProfileMeasurements& m) {
  ClusterSpec& c = f.cluster;
  GroupGuard guard(f);
  LinkSpec& l = c.node.intra;
  const auto& big = m.all_reduce.back();
  const double busbw = 2.0 * (m.ranks - 1) / m.ranks * double(big.bytes) / big.time_s / 1e9;
  if (busbw > l.bandwidth_gbps) {
    f.adjusted.push_back("node.intra.bandwidth_gbps: " + num(l.bandwidth_gbps) +
                         " in the file, all-reduce bus bandwidth " + num(busbw) +
                         " measured; set to twice the measurement");
    l.bandwidth_gbps = 2 * busbw;
  }
  // Latency from the smallest messages, then bandwidth and its ramp from all of them.
  double lat = fit_1d(1e-8, 1e-2, [&](double x) {
    ClusterSpec t = c;
    t.node.intra.latency_s = x;
    t.node.intra.half_bandwidth_bytes = 0;
    std::vector<CollectiveSample> small(m.all_reduce.begin(), m.all_reduce.begin() + 1);
    return log_error(t, m, small);
  });
  double best_err = std::numeric_limits<double>::infinity();
  double best_eff = l.bus_efficiency, best_half = 0, best_lat = lat;
  for (double lat_scale : {0.25, 0.5, 0.75, 1.0}) {
    const auto [eff, half] = fit_2d(0.005, 1.0, 1.0, 1e9, [&](double e, double h) {
      ClusterSpec t = c;
      t.node.intra.bus_efficiency = e;
      t.node.intra.half_bandwidth_bytes = int64_t(h);
      t.node.intra.latency_s = lat * lat_scale;
      return log_error(t, m, m.all_reduce);
    });
    ClusterSpec t = c;
    t.node.intra.bus_efficiency = eff;
    t.node.intra.half_bandwidth_bytes = int64_t(half);
    t.node.intra.latency_s = lat * lat_scale;
    const double e = log_error(t, m, m.all_reduce);
    if (e < best_err) best_err = e, best_eff = eff, best_half = half, best_lat = lat * lat_scale;
  }
  l.bus_efficiency = best_eff;
  l.half_bandwidth_bytes = int64_t(best_half);
  l.latency_s = best_lat;
  for (const char* n : {"node.intra.latency_s", "node.intra.allreduce_bus_efficiency",
                        "node.intra.half_bandwidth_bytes"})
    f.measured.push_back(n);
  guard.keep_if_better(m, m.all_reduce, "node.intra");
}

// The PCIe link (bandwidth and latency) from the host copy samples.
void fit_copy(ProfileFit& f, const ProfileMeasurements& m) {
  ClusterSpec& c = f.cluster;
  GroupGuard guard(f);
  const auto [bw, lat] = fit_2d(1e-3, 1e4, 1e-8, 1e-2, [&](double b, double l) {
    ClusterSpec t = c;
    t.node.pcie.bandwidth_gbps = b;
    t.node.pcie.latency_s = l;
    return log_error(t, m, m.copy);
  });
  c.node.pcie.bandwidth_gbps = bw;
  c.node.pcie.latency_s = lat;
  f.measured.push_back("node.pcie.bandwidth_gbps");
  f.measured.push_back("node.pcie.latency_s");
  guard.keep_if_better(m, m.copy, "node.pcie");
}

// Every group fitted in turn, starting from `base`, but those in `held`, which keep the file's
// values.
ProfileFit fit_groups(const ClusterSpec& base, const ProfileMeasurements& m, unsigned held) {
  ProfileFit f;
  f.base = base;
  f.cluster = base;
  const Dtype dt = dtype_from_string(m.compute_dtype, "profile compute_dtype");

  if (m.launch_s > 0 && !(held & kLaunch)) take_launch(f, m);

  if (!m.stream.empty() && !(held & kStream))
    fit_stream(f, m);
  else if (m.stream.empty())
    f.not_measured.push_back("gpu.memory_efficiency: no stream sample");

  if (!m.gemm.empty() && !(held & kGemm))
    fit_gemm(f, m, dt);
  else if (m.gemm.empty())
    f.not_measured.push_back("gpu.gemm: no GEMM sample");

  std::vector<AttentionSample> kept, flash;
  for (const auto& s : m.attention) (s.probabilities_kept ? kept : flash).push_back(s);
  fit_attention(f, m, kept, &GpuSpec::attention_standard_efficiency,
                "gpu.attention.standard_efficiency");
  fit_attention(f, m, flash, &GpuSpec::attention_flash_efficiency,
                "gpu.attention.flash_efficiency");

  if (!m.all_reduce.empty())
    fit_all_reduce(f, m);
  else
    f.not_measured.push_back("node.intra: one rank, no collective to time");

  if (!m.copy.empty()) fit_copy(f, m);
  f.not_measured.push_back("node.nics, network: one node has no inter-node traffic to time");
  f.not_measured.push_back("node.host_flops, node.host_memory_bandwidth_gbps: not profiled");
  f.not_measured.push_back(
      "gpu.process (CUDA context, cuBLAS, NCCL), gpu.allocator_fragmentation: not profiled");

  f.before = fit_quality(base, m);
  f.after = fit_quality(f.cluster, m);
  return f;
}

bool no_worse(const FitQuality& a, const FitQuality& b) {
  return a.gemm_error_pct <= b.gemm_error_pct && a.attention_error_pct <= b.attention_error_pct &&
         a.stream_error_pct <= b.stream_error_pct &&
         a.all_reduce_error_pct <= b.all_reduce_error_pct && a.copy_error_pct <= b.copy_error_pct;
}

}  // namespace

// Each group keeps the file's values when its fit is no better (GroupGuard), but three groups
// set figures that other groups' predictions use: the launch overhead, the stream group's
// memory figures and the GEMM group's peak. A group that keeps the file's values may then
// still end worse than the file did. So the shared groups are taken only as far as no kind
// ends worse than the file: the fit is repeated with the fewest of them holding the file's
// values. With all three held, every other group starts from the file's values for each figure
// its kind's prediction uses, so its own guard keeps that kind no worse.
ProfileFit fit_profile(const ClusterSpec& base, const ProfileMeasurements& m) {
  constexpr unsigned order[] = {0,
                                kLaunch,
                                kGemm,
                                kStream,
                                kLaunch | kGemm,
                                kLaunch | kStream,
                                kGemm | kStream,
                                kLaunch | kGemm | kStream};
  ProfileFit f;
  unsigned held = 0;
  for (unsigned h : order) {
    held = h;
    f = fit_groups(base, m, held);
    if (no_worse(f.after, f.before)) break;
  }
  auto note = [&](unsigned group, const std::string& what) {
    if (held & group)
      f.not_measured.push_back(what + ": measured, but other kinds fit worse than the file's " +
                               "values with it; kept");
  };
  if (m.launch_s > 0)
    note(kLaunch, "gpu.kernel_launch_s (" + num(m.launch_s) + " s measured, " +
                      num(base.gpu.kernel_launch_s) + " s in the file)");
  if (!m.stream.empty()) note(kStream, "gpu.memory_efficiency");
  if (!m.gemm.empty()) note(kGemm, "gpu.gemm");
  return f;
}

}  // namespace stratagem
