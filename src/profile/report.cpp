// The measured cluster file: the fitted ClusterSpec plus what was measured, how, and how well
// the cost model reproduces it before and after the fit.
#include <functional>
#include <nlohmann/json.hpp>

#include "stratagem/profile.hpp"
#include "stratagem/spec_json.hpp"
#include "stratagem/version.hpp"

namespace stratagem {
namespace {

template <class Sample>
nlohmann::json rows(const std::vector<Sample>& v, const ProfileFit& f, const ProfileMeasurements& m,
                    const std::function<nlohmann::json(const Sample&)>& shape) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& s : v) {
    nlohmann::json r = shape(s);
    r["time_s"] = s.time_s;
    r["model_time_s_before"] = predicted_time_s(f.base, m, s);
    r["model_time_s_after"] = predicted_time_s(f.cluster, m, s);
    out.push_back(r);
  }
  return out;
}

nlohmann::json to_json(const FitQuality& q) {
  return {{"definition", "100 * (exp(mean |ln(model_time_s / time_s)|) - 1)"},
          {"gemm_error_pct", q.gemm_error_pct},
          {"attention_error_pct", q.attention_error_pct},
          {"stream_error_pct", q.stream_error_pct},
          {"all_reduce_error_pct", q.all_reduce_error_pct},
          {"copy_error_pct", q.copy_error_pct}};
}

}  // namespace

nlohmann::json profile_cluster_json(const ProfileFit& fit, const ProfileMeasurements& m,
                                    const std::string& base_source) {
  nlohmann::json j = to_json(fit.cluster);
  nlohmann::json p;
  p["measured_by"] = std::string("stratagem profile ") + kVersion;
  p["base_cluster"] = base_source;
  p["backend"] = m.backend;
  p["compute_dtype"] = m.compute_dtype;
  p["ranks"] = m.ranks;
  p["threads_per_rank"] = m.threads_per_rank;
  p["launch_s"] = m.launch_s;
  p["measured_fields"] = fit.measured;
  p["not_measured"] = fit.not_measured;
  p["adjusted"] = fit.adjusted;
  p["fit_error_before"] = to_json(fit.before);
  p["fit_error_after"] = to_json(fit.after);
  p["gemm"] = rows<GemmSample>(m.gemm, fit, m, [](const GemmSample& s) {
    return nlohmann::json{{"m", s.m}, {"n", s.n}, {"k", s.k}, {"flops", 2.0 * s.m * s.n * s.k}};
  });
  p["attention"] = rows<AttentionSample>(m.attention, fit, m, [](const AttentionSample& s) {
    return nlohmann::json{{"batch", s.batch},
                          {"seq", s.seq},
                          {"heads", s.heads},
                          {"head_dim", s.head_dim},
                          {"probabilities_kept", s.probabilities_kept}};
  });
  p["stream"] = rows<StreamSample>(m.stream, fit, m, [](const StreamSample& s) {
    return nlohmann::json{{"bytes", s.bytes}};
  });
  p["all_reduce"] = rows<CollectiveSample>(m.all_reduce, fit, m, [](const CollectiveSample& s) {
    return nlohmann::json{{"bytes", s.bytes}};
  });
  p["copy"] = rows<CopySample>(m.copy, fit, m, [](const CopySample& s) {
    return nlohmann::json{{"bytes", s.bytes}};
  });
  j["profile"] = p;
  return j;
}

}  // namespace stratagem
