// The zero-bubble schedules in the search. The DP's pipeline and memory relaxations are 1F1B's
// (a split backward's bubble and held-back W are not in them), so it does not search under zb-h1
// or zb-h2; instead each of the full space's best 1F1B plans whose layers the split backward can
// run (validate_split_backward) is tried with them: the same partition and layer strategies,
// estimated with the split's memory, kept only where it fits and beats the plans in the pool. The
// re-rank then simulates them beside the rest.
#include "src/search/searcher.hpp"
#include "stratagem/error.hpp"

namespace stratagem::search_detail {

void Searcher::split_backward_variants() {
  std::vector<Plan> base;
  for (const SearchCandidate& c : full_.items())
    if (c.plan.schedule == Schedule::one_f_one_b && c.plan.pp > 1) base.push_back(c.plan);
  for (const Plan& p : base)
    for (Schedule s : {Schedule::zb_h1, Schedule::zb_h2}) {
      if (!contains(o_.schedules, s)) continue;
      Plan q = p;
      q.schedule = s;
      try {
        validate_split_backward(q, m_, "search");
      } catch (const InputError&) {
        continue;  // MoE layers, cp, ZeRO-2/3 or activation offload: not split yet
      }
      consider(q, "dp", nullptr);
    }
}

}  // namespace stratagem::search_detail
