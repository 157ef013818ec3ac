// Peak device memory per pipeline stage, in closed form (see plan_costs.cpp for the walk).
#include "src/cost/plan_costs.hpp"
#include "stratagem/cost.hpp"

namespace stratagem {

std::vector<MemoryBreakdown> stage_memory(const CostModel& cost, const Plan& plan) {
  std::vector<cost_detail::StageCost> stages;
  cost_detail::analyze(cost, plan, /*with_time=*/false, stages);
  std::vector<MemoryBreakdown> out;
  out.reserve(stages.size());
  for (const auto& s : stages) out.push_back(s.memory);
  return out;
}

int64_t workspace_bytes(const CostModel& cost, const Plan& plan, int stage) {
  std::vector<cost_detail::StageCost> stages;
  cost_detail::analyze(cost, plan, /*with_time=*/false, stages);
  return stages.at(stage).workspace_bytes;
}

}  // namespace stratagem
