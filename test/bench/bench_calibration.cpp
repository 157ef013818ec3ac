// `make bench`: the estimator against every published Megatron-LM A100 run (iteration time
// implied by the paper's TFLOP/s), row by row, and the mean absolute percentage error.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "stratagem/cost.hpp"
#include "stratagem/estimate.hpp"
#include "test/calibration/megatron_rows.hpp"

using namespace stratagem;

int main() {
  const auto rows = calibration::load_rows();
  std::printf("estimate vs %s\n", calibration::megatron_file().c_str());
  std::printf("%-5s %-17s %-38s %10s %10s %8s\n", "row", "framework", "plan", "predicted", "published",
              "error");
  double sum = 0, sum_megatron = 0;
  int within = 0, n_megatron = 0;
  for (const auto& r : rows) {
    CostModel cost(r.model, r.cluster, r.plan);
    const Estimate e = estimate(cost);
    const double err = (e.iteration_time_s - r.published_s) / r.published_s;
    sum += std::abs(err);
    within += std::abs(err) <= 0.15;
    if (r.framework == "Megatron") sum_megatron += std::abs(err), ++n_megatron;
    std::printf("%-5s %-17s %-38s %9.3fs %9.3fs %+7.1f%%\n", r.id.c_str(), r.framework.c_str(),
                r.plan.describe().substr(0, 38).c_str(), e.iteration_time_s, r.published_s, 100 * err);
  }
  std::printf("MAPE over all %zu rows: %.1f%%  (%d within 15%%)\n", rows.size(), 100 * sum / rows.size(),
              within);
  std::printf("MAPE over the %d Megatron PTD-P rows: %.1f%%; the DeepSpeed ZeRO-3 rows are known misses "
              "(see test/calibration/test_calibration.cpp)\n",
              n_megatron, 100 * sum_megatron / std::max(1, n_megatron));
  return 0;
}
