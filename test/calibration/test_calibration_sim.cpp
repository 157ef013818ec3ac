// The simulator against the published Megatron-LM A100 runs: every rank's Program in virtual
// time on the same cost model as the estimator. Same tolerances and the same stated exception
// for the DeepSpeed ZeRO-3 rows as test_calibration.cpp.
#define BOOST_TEST_MODULE calibration_sim
#include <mpi.h>

#include <boost/test/unit_test.hpp>
#include <cmath>

#include "stratagem/cost.hpp"
#include "stratagem/simulate.hpp"
#include "test/calibration/h100_rows.hpp"
#include "test/calibration/memory_rows.hpp"
#include "test/calibration/small_jobs.hpp"

using namespace stratagem;

namespace {
// |simulated - published| / published over the 16 PTD-P rows: MAPE and worst row (issue 15).
constexpr double kRowTolerance = 0.10;
constexpr double kMapeTolerance = 0.05;

struct MpiFixture {
  MpiFixture() { MPI_Init(nullptr, nullptr); }
  ~MpiFixture() { MPI_Finalize(); }
};
BOOST_TEST_GLOBAL_FIXTURE(MpiFixture);

double simulated_s(const calibration::Row& r) {
  CostModel cost(r.model, r.cluster, r.plan.dtype, r.software);
  const CostModelCosts costs(cost, r.plan);
  const SimResult sim =
      simulate(build_program(r.model, r.plan), Layout(r.plan, r.cluster), r.cluster, costs);
  BOOST_TEST(!sim.oom.oom, r.id << " runs out of memory in the simulator");
  return double(sim.makespan_ns) * 1e-9 / sim.iterations;
}
}  // namespace

BOOST_AUTO_TEST_CASE(megatron_ptdp_rows_mape_within_5_percent_simulated) {
  int n = 0;
  double sum = 0;
  for (const auto& r : calibration::load_rows()) {
    if (r.framework != "Megatron") continue;
    const double t = simulated_s(r);
    BOOST_TEST_INFO(r.id << ": simulated " << t << " s, published " << r.published_s << " s");
    const double err = std::abs(t - r.published_s) / r.published_s;
    BOOST_TEST(err <= kRowTolerance);
    sum += err;
    ++n;
  }
  BOOST_TEST(n == 16);
  BOOST_TEST_INFO("simulator MAPE " << 100 * sum / n << "%");
  BOOST_TEST(sum / n <= kMapeTolerance);
}

BOOST_AUTO_TEST_CASE(deepspeed_zero3_rows_are_a_lower_bound_simulated) {
  // Known miss (see test_calibration.cpp): the published ZeRO-3 times do not shrink with more
  // GPUs, i.e. framework overhead our Program does not model. The forecast must stay a
  // physically possible lower bound, not a fit.
  for (const auto& r : calibration::load_rows()) {
    if (r.framework == "Megatron") continue;
    const double t = simulated_s(r);
    BOOST_TEST_INFO(r.id << ": simulated " << t << " s, published " << r.published_s << " s");
    BOOST_TEST(t < r.published_s);
    BOOST_TEST(t > 0.15 * r.published_s);
  }
}

BOOST_AUTO_TEST_CASE(h100_mape_regression_bounds_simulated) {
  // As test_calibration.cpp's h100_mape_regression_bounds, for the simulator: the file within
  // the 8% (reached: megatron-core 5.9%, fsdp-eager 7.1%, the file 5.9%, the worst row
  // r092 15.8% fast).
  double sum = 0, mc_sum = 0, fsdp_sum = 0;
  int n = 0, mc_n = 0, fsdp_n = 0;
  for (const auto& h : calibration::load_h100_rows()) {
    if (!h.reason.empty()) continue;
    const double t = simulated_s(h.row);
    const double err = std::abs(t - h.row.published_s) / h.row.published_s;
    BOOST_TEST_INFO(h.row.id << ": simulated " << t << " s, published " << h.row.published_s);
    BOOST_TEST(err <= 0.17);
    sum += err, ++n;
    if (h.row.framework == "megatron-core") mc_sum += err, ++mc_n;
    if (h.row.framework == "fsdp-eager") fsdp_sum += err, ++fsdp_n;
  }
  BOOST_TEST(n == 14);
  BOOST_TEST(mc_n == 9);
  BOOST_TEST(fsdp_n == 4);
  BOOST_TEST_INFO("megatron-core simulator MAPE " << 100 * mc_sum / mc_n << "%");
  BOOST_TEST(mc_sum / mc_n <= 0.065);
  BOOST_TEST_INFO("fsdp-eager simulator MAPE " << 100 * fsdp_sum / fsdp_n << "%");
  BOOST_TEST(fsdp_sum / fsdp_n <= 0.08);
  BOOST_TEST_INFO("H100 file simulator MAPE " << 100 * sum / n << "%");
  BOOST_TEST(sum / n <= 0.08);
}

BOOST_AUTO_TEST_CASE(small_jobs_on_one_node_mape_within_12_percent_simulated) {
  // As test_calibration.cpp's small_jobs_on_one_node_mape_within_12_percent, for the simulator:
  // the 12% over data/calibration/small-jobs.json, errors of both signs.
  calibration::ErrorTally tally;
  for (const auto& h : calibration::load_small_job_rows()) {
    if (!h.reason.empty()) continue;
    const double t = simulated_s(h.row);
    const double err = (t - h.row.published_s) / h.row.published_s;
    BOOST_TEST_MESSAGE(h.row.id << ": simulated " << t << " s, published " << h.row.published_s
                                << " (" << 100 * err << "%)");
    tally.add(err);
  }
  BOOST_TEST(tally.n >= 20);
  BOOST_TEST_INFO("small jobs simulator MAPE " << 100 * tally.mape() << "%");
  BOOST_TEST(tally.mape() <= 0.12);
  BOOST_TEST(tally.fast > 0);
  BOOST_TEST(tally.slow > 0);
}

BOOST_AUTO_TEST_CASE(memory_rows_simulated_peak_is_the_estimate) {
  // The simulator's peak of each forecast memory row, of the kind the row measured, is the
  // estimator's to the byte: one cost model, one formula from tensors to device bytes.
  int n = 0;
  for (const auto& r : calibration::load_memory_rows()) {
    if (!r.reason.empty()) continue;
    CostModel cost(r.row.model, r.row.cluster, r.row.plan.dtype, r.row.software);
    const Estimate e = estimate(cost, r.row.plan);
    const CostModelCosts costs(cost, r.row.plan);
    const SimResult sim = simulate(build_program(r.row.model, r.row.plan, r.row.software),
                                   Layout(r.row.plan, r.row.cluster), r.row.cluster, costs);
    for (const calibration::MemoryKind k :
         {calibration::MemoryKind::allocated, calibration::MemoryKind::reserved,
          calibration::MemoryKind::device}) {
      int64_t simulated = 0, estimated = 0;
      for (const SimRankResult& x : sim.ranks)
        if (!r.rank0 || x.rank == 0)
          simulated = std::max(simulated, calibration::forecast_bytes(peak_breakdown(x), k));
      for (size_t s = 0; s < (r.rank0 ? 1 : e.stages.size()); ++s)
        estimated = std::max(estimated, calibration::forecast_bytes(e.stages[s].memory, k));
      BOOST_TEST_INFO(r.row.id << " " << calibration::to_string(k));
      BOOST_TEST(simulated == estimated);
    }
    ++n;
  }
  BOOST_TEST(n == 21);
}
