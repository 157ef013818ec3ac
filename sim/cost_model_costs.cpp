// The cost model as the simulator's source of op costs.
#include "stratagem/simulate.hpp"

namespace stratagem {

CostModelCosts::CostModelCosts(const CostModel& cost, const Plan& plan) : cost_(cost) {
  for (int s = 0; s < plan.pp; ++s) {
    workspace_.push_back(stratagem::workspace_bytes(cost, plan, s));
    process_.push_back(stratagem::process_memory(cost.model(), cost.cluster(), plan, s));
  }
}

double CostModelCosts::compute_time_s(const Op& op) const {
  return cost_.compute_time_s(op);
}

CommCost CostModelCosts::comm_cost(const Op& op, const Layout& layout, int rank) const {
  return cost_.comm_cost(op, layout, rank);
}

double CostModelCosts::host_issue_time_s(const Op& op) const {
  return cost_.host_issue_time_s(op);
}

int64_t CostModelCosts::workspace_bytes(int stage) const {
  return stage >= 0 && stage < int(workspace_.size()) ? workspace_[stage] : 0;
}

ProcessMemory CostModelCosts::process_memory(int stage) const {
  return stage >= 0 && stage < int(process_.size()) ? process_[stage] : ProcessMemory{};
}

}  // namespace stratagem
