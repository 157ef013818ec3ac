// The search's record of evaluated plans (src/search/evaluated.hpp) against brute force: its
// front is exactly the Pareto front of every plan offered, its sample never exceeds the cap and
// is the cap's smallest hashes, and two logs merged equal one log of all the plans (so the MPI
// processes' records merge into the single-process record).
#define BOOST_TEST_MODULE search_evaluated
#include <boost/test/unit_test.hpp>
#include <random>
#include <set>

#include "src/search/evaluated.hpp"

using namespace stratagem;
using namespace stratagem::search_detail;

namespace {

struct Fig {
  double time, tokens;
  int64_t peak;
};

std::vector<Fig> random_figures(int n, unsigned seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> peak(1, 400);  // few values: ties in peak happen
  std::uniform_int_distribution<int> tok(1, 300);       // and in throughput
  std::vector<Fig> v;
  for (int i = 0; i < n; ++i) {
    const double t = tok(rng);
    v.push_back({1e6 / t, t, peak(rng) << 20});
  }
  return v;
}

std::set<std::pair<int64_t, double>> brute_front(const std::vector<Fig>& v) {
  std::set<std::pair<int64_t, double>> out;
  for (const auto& a : v) {
    bool dominated = false;
    for (const auto& b : v)
      dominated |=
          b.peak <= a.peak && b.tokens >= a.tokens && (b.peak < a.peak || b.tokens > a.tokens);
    if (!dominated) out.insert({a.peak, a.tokens});
  }
  return out;
}

std::set<std::pair<int64_t, double>> front_of(const std::vector<EvaluatedPlan>& v) {
  std::set<std::pair<int64_t, double>> out;
  for (const auto& e : v)
    if (e.pareto) out.insert({e.peak_memory_bytes, e.tokens_per_s});
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(front_is_exact_and_sample_is_bounded) {
  const Plan p;
  for (int n : {10, 500, 5000}) {
    const auto figs = random_figures(n, unsigned(n));
    EvaluatedLog log;
    for (const auto& f : figs) log.record(p, f.time, f.tokens, f.peak, "dp");
    const auto plans = log.plans();
    BOOST_TEST(front_of(plans) == brute_front(figs));
    // Distinct figures, at most the cap besides the front.
    std::set<std::tuple<double, double, int64_t>> distinct;
    for (const auto& f : figs) distinct.insert({f.time, f.tokens, f.peak});
    const size_t fronts = front_of(plans).size();
    BOOST_TEST(plans.size() <= std::min<size_t>(distinct.size(), kEvaluatedSampleCap + fronts));
    if (distinct.size() <= size_t(kEvaluatedSampleCap)) BOOST_TEST(plans.size() == distinct.size());
    for (const auto& e : plans) BOOST_TEST(e.description == p.describe());
  }
}

BOOST_AUTO_TEST_CASE(merged_logs_equal_one_log) {
  const Plan p;
  const auto figs = random_figures(6000, 7);
  EvaluatedLog all, a, b, merged;
  for (size_t i = 0; i < figs.size(); ++i) {
    all.record(p, figs[i].time, figs[i].tokens, figs[i].peak, "dp");
    (i % 2 ? a : b).record(p, figs[i].time, figs[i].tokens, figs[i].peak, "dp");
  }
  for (const auto& e : a.plans()) merged.record(e);
  for (const auto& e : b.plans()) merged.record(e);
  const auto x = all.plans(), y = merged.plans();
  BOOST_TEST_REQUIRE(x.size() == y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    BOOST_TEST(x[i].hash == y[i].hash);
    BOOST_TEST(x[i].pareto == y[i].pareto);
  }
}
