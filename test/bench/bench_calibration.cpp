// `make bench`: the estimator and the simulator against every published run of each
// calibration file (data/calibration/), row by row, side by side, with the mean absolute
// percentage error (MAPE) per file and per framework. Rows the model cannot express are listed
// with the reason; the DeepSpeed-2021 ZeRO-3 rows are reported apart (a bound, see
// test/calibration/test_calibration.cpp). Per file, the ranking figures of each group of rows
// that share model, cluster, GPUs and batch (test/calibration/ranking.hpp). Last, the peak GPU
// memory of every row of data/calibration/memory.json against the forecast of the kind the row
// measured (test/calibration/memory_rows.hpp), with the GPU process ledger beside it.
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "stratagem/cost.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/simulate.hpp"
#include "test/calibration/h100_rows.hpp"
#include "test/calibration/memory_rows.hpp"
#include "test/calibration/moe_rows.hpp"
#include "test/calibration/ranking.hpp"
#include "test/calibration/small_jobs.hpp"
#include "test/calibration/tp_one_node.hpp"

using namespace stratagem;

namespace {
struct Mape {
  double est = 0, sim = 0;
  int n = 0;
  void add(double e, double s) { est += std::abs(e), sim += std::abs(s), ++n; }
};

// One forecast row's signed errors, kept for a file's breakdown by tp degree.
struct RowError {
  int tp = 1;
  double est = 0, sim = 0;
};

std::vector<RowError> print_file(const char* path, const std::vector<calibration::Row>& rows,
                                 const std::vector<std::string>& reasons) {
  std::printf("\n%s\n", path);
  std::printf("%-5s %-17s %-40s %10s %10s %8s %10s %8s\n", "row", "framework", "plan", "published",
              "estimate", "error", "simulate", "error");
  std::map<std::string, Mape> per_framework;
  Mape file;
  std::vector<calibration::RankedRow> ranked;
  std::vector<RowError> errors;
  for (size_t i = 0; i < rows.size(); ++i) {
    const calibration::Row& r = rows[i];
    if (!reasons[i].empty()) {
      std::printf("%-5s %-17s not expressible: %s\n", r.id.c_str(), r.framework.c_str(),
                  reasons[i].c_str());
      continue;
    }
    CostModel cost(r.model, r.cluster, r.plan.dtype, r.software);
    const Estimate e = estimate(cost, r.plan);
    const CostModelCosts costs(cost, r.plan);
    const SimResult sim =
        simulate(build_program(r.model, r.plan), Layout(r.plan, r.cluster), r.cluster, costs);
    const double sim_s = double(sim.makespan_ns) * 1e-9 / sim.iterations;
    const double err = (e.iteration_time_s - r.published_s) / r.published_s;
    const double sim_err = (sim_s - r.published_s) / r.published_s;
    std::printf("%-5s %-17s %-40s %9.3fs %9.3fs %+7.1f%% %9.3fs %+7.1f%%\n", r.id.c_str(),
                r.framework.c_str(), r.plan.describe().substr(0, 40).c_str(), r.published_s,
                e.iteration_time_s, 100 * err, sim_s, 100 * sim_err);
    std::fflush(stdout);
    per_framework[r.framework].add(err, sim_err);
    errors.push_back({r.plan.layers.empty() ? 1 : r.plan.layers.front().tp, err, sim_err});
    ranked.push_back({calibration::group_key(r), r.id, r.published_s, e.iteration_time_s, sim_s});
    // The DeepSpeed-2021 ZeRO-3 rows are a bound, not a forecast: reported apart.
    if (r.framework.find("DeepSpeed") == std::string::npos) file.add(err, sim_err);
  }
  for (const auto& [name, m] : per_framework)
    std::printf("  MAPE %-17s (%2d rows): estimate %5.1f%%  simulate %5.1f%%\n", name.c_str(), m.n,
                100 * m.est / m.n, 100 * m.sim / m.n);
  if (file.n > 0)
    std::printf("  MAPE file, forecast rows (%2d): estimate %5.1f%%  simulate %5.1f%%\n", file.n,
                100 * file.est / file.n, 100 * file.sim / file.n);
  calibration::print_ranking(ranked);
  return errors;
}
// Tensor parallelism inside one node: the MAPE and the signed errors of each tp degree.
void print_per_tp(const std::vector<RowError>& errors) {
  std::map<int, std::vector<RowError>> by_tp;
  for (const RowError& e : errors) by_tp[e.tp].push_back(e);
  for (const auto& [tp, rows] : by_tp) {
    Mape m;
    std::string est, sim;
    char buf[32];
    for (const RowError& e : rows) {
      m.add(e.est, e.sim);
      std::snprintf(buf, sizeof buf, " %+.1f%%", 100 * e.est), est += buf;
      std::snprintf(buf, sizeof buf, " %+.1f%%", 100 * e.sim), sim += buf;
    }
    std::printf(
        "  tp %d (%d rows): MAPE estimate %5.1f%%  simulate %5.1f%%  errors estimate%s  "
        "simulate%s\n",
        tp, m.n, 100 * m.est / m.n, 100 * m.sim / m.n, est.c_str(), sim.c_str());
  }
}
// A file in the H100 schema: rows the model cannot express carry their reason.
std::vector<RowError> print_h100_schema(const std::string& path,
                                        const std::vector<calibration::H100Row>& h100) {
  std::vector<calibration::Row> rows;
  std::vector<std::string> reasons;
  for (const auto& h : h100) {
    rows.push_back(h.row);
    reasons.push_back(h.reason);
  }
  return print_file(path.c_str(), rows, reasons);
}
// The memory file: per row the published peak, the estimator's and the simulator's forecast of
// the same kind (allocated, reserved or device) and their signed errors, and the estimator's
// parts (tensors, then the ledger: cuBLAS workspace, fragmentation, CUDA context, NCCL); rows the
// model cannot express with their reason. The MAPE overall and per kind, with how many rows
// each sign holds.
void print_memory_file() {
  constexpr double kGib = double(1LL << 30);
  std::printf(
      "\n%s (peak GPU memory, GiB; each row against the forecast of the kind it measured)\n",
      calibration::memory_file().c_str());
  std::printf("%-6s %-13s %-9s %-34s %9s %9s %7s %9s %7s | %7s %6s %5s %5s %5s\n", "row",
              "framework", "kind", "plan", "published", "estimate", "error", "simulate", "error",
              "tensors", "cuBLAS", "frag", "ctx", "NCCL");
  std::map<std::string, calibration::ErrorTally> est_by_kind, sim_by_kind;
  calibration::ErrorTally est, sim;
  std::map<std::string, int> skipped;
  for (const calibration::MemoryRow& r : calibration::load_memory_rows()) {
    if (!r.reason.empty()) {
      std::printf("%-6s %-13s skipped: %s\n", r.row.id.c_str(), r.row.framework.c_str(),
                  r.reason.c_str());
      ++skipped[r.reason.substr(0, r.reason.find(':'))];
      continue;
    }
    CostModel cost(r.row.model, r.row.cluster, r.row.plan.dtype, r.row.software);
    const Estimate e = estimate(cost, r.row.plan);
    const MemoryBreakdown& m = r.rank0 ? e.stages[0].memory : e.memory;
    const double est_gib = double(calibration::forecast_bytes(m, r.kind)) / kGib;
    const CostModelCosts costs(cost, r.row.plan);
    const SimResult s = simulate(build_program(r.row.model, r.row.plan, r.row.software),
                                 Layout(r.row.plan, r.row.cluster), r.row.cluster, costs);
    int64_t sim_bytes = 0;
    for (const SimRankResult& x : s.ranks) {
      if (r.rank0 && x.rank != 0) continue;
      sim_bytes = std::max(sim_bytes, calibration::forecast_bytes(peak_breakdown(x), r.kind));
    }
    const double sim_gib = double(sim_bytes) / kGib;
    const double err = (est_gib - r.published_gib) / r.published_gib;
    const double sim_err = (sim_gib - r.published_gib) / r.published_gib;
    const char* kind = calibration::to_string(r.kind);
    std::printf(
        "%-6s %-13s %-9s %-34s %9.2f %9.2f %+6.1f%% %9.2f %+6.1f%% | %7.2f %6.3f %5.2f %5.2f "
        "%5.2f\n",
        r.row.id.c_str(), r.row.framework.c_str(), kind,
        r.row.plan.describe().substr(0, 34).c_str(), r.published_gib, est_gib, 100 * err, sim_gib,
        100 * sim_err, double(m.tensor_bytes()) / kGib, double(m.cublas_workspace_bytes) / kGib,
        double(m.fragmentation_bytes) / kGib, double(m.cuda_context_bytes) / kGib,
        double(m.nccl_buffers_bytes) / kGib);
    std::fflush(stdout);
    est.add(err), sim.add(sim_err);
    est_by_kind[kind].add(err), sim_by_kind[kind].add(sim_err);
  }
  for (const auto& [kind, t] : est_by_kind)
    std::printf("  MAPE %-9s (%2d rows): estimate %5.1f%% (%d under, %d over)  simulate %5.1f%%\n",
                kind.c_str(), t.n, 100 * t.mape(), t.fast, t.slow, 100 * sim_by_kind[kind].mape());
  std::printf(
      "  MAPE file, forecast rows (%2d): estimate %5.1f%% (%d under, %d over)  simulate "
      "%5.1f%% (%d under, %d over)\n",
      est.n, 100 * est.mape(), est.fast, est.slow, 100 * sim.mape(), sim.fast, sim.slow);
  for (const auto& [why, n] : skipped) std::printf("  skipped (%2d rows): %s\n", n, why.c_str());
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // --memory: the memory file alone.
  if (argc > 1 && std::string(argv[1]) == "--memory") {
    print_memory_file();
    MPI_Finalize();
    return 0;
  }
  {
    const auto rows = calibration::load_rows();
    print_file(calibration::megatron_file().c_str(), rows, std::vector<std::string>(rows.size()));
    std::printf(
        "  (DeepSpeed ZeRO-3 rows: bound by DeepSpeed 2021's parameter gathers, not a forecast; "
        "see test/calibration/test_calibration.cpp)\n");
  }
  print_h100_schema(calibration::h100_file(), calibration::load_h100_rows());
  {
    const auto rows = calibration::load_long_context_rows();
    print_file("long-context rows of the H100 file, under their stand-in framework (cp > 1)", rows,
               std::vector<std::string>(rows.size()));
  }
  print_per_tp(
      print_h100_schema(calibration::small_jobs_file(), calibration::load_small_job_rows()));
  print_h100_schema(calibration::moe_file(), calibration::load_moe_rows());
  print_per_tp(
      print_h100_schema(calibration::tp_one_node_file(), calibration::load_tp_one_node_rows()));
  print_memory_file();
  MPI_Finalize();
  return 0;
}
