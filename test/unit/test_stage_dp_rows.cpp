// The stage DP's row answers (best_costs, one row or several rows sharing their caps) equal its
// single answers (best_within) bit for bit, for every layer count, with and without entry costs,
// on random problems: several classes, cover levels, thresholds and budgets from "nothing fits"
// to "everything fits". The reconstructed sequences have the cost claimed.
#define BOOST_TEST_MODULE stage_dp_rows
#include <boost/test/unit_test.hpp>
#include <random>

#include "src/search/stage_dp.hpp"

using namespace stratagem::search_detail;

namespace {

StageDpProblem random_problem(std::mt19937_64& rng, int classes, int items, int n_max, bool exact) {
  std::uniform_real_distribution<double> cost(0.5, 2.0), small(0.0, 0.2);
  // Few distinct memory figures: the exact mode makes a threshold of each combination.
  std::uniform_int_distribution<int64_t> w(1, 12), mib(0, 7);
  StageDpProblem p;
  p.num_classes = classes;
  p.n_max = n_max;
  p.bucket_bytes = 64LL << 20;
  p.max_budget_bytes = 160 * p.bucket_bytes;
  p.exact = exact;
  p.max_kept_levels = 2;
  for (int i = 0; i < items; ++i) {
    DpItem it;
    it.id = 100 + i;
    it.cls = int(rng() % uint64_t(classes));
    it.w = w(rng);
    // Less memory costs more time, as a layer strategy's recomputation or sharding does.
    it.cost = cost(rng) + 0.05 * double(12 - it.w);
    it.first = rng() % 3 == 0 ? small(rng) : 0.0;
    it.last = rng() % 3 == 0 ? small(rng) : 0.0;
    it.tr = mib(rng) * (400LL << 20);
    it.kept = mib(rng) / 2 * (300LL << 20);
    it.ws = mib(rng) / 3 * (200LL << 20);
    p.items.push_back(it);
  }
  p.reshard.assign(size_t(classes) * classes, 0.0);
  for (int a = 0; a < classes; ++a)
    for (int b = 0; b < classes; ++b) p.reshard[size_t(a) * classes + b] = a == b ? 0 : small(rng);
  return p;
}

// Trial `trial`'s problem and `count` entry-cost vectors (a cost per class).
struct Trial {
  StageDpProblem problem;
  std::vector<std::vector<double>> entries;
};
Trial make_trial(std::mt19937_64& rng, int trial, int count) {
  const int classes = 1 + trial % 4;
  Trial t{random_problem(rng, classes, 10 + trial % 20, 2 + trial % 7, trial % 3 == 0),
          std::vector<std::vector<double>>(size_t(count))};
  for (auto& e : t.entries)
    for (int c = 0; c < classes; ++c) e.push_back(0.1 * double(rng() % 7) / 3.0);
  return t;
}

}  // namespace

BOOST_AUTO_TEST_CASE(rows_equal_single_answers) {
  std::mt19937_64 rng(20261202);
  int compared = 0, finite = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const Trial tr = make_trial(rng, trial, 3);
    const StageDpProblem& p = tr.problem;
    const int n_max = p.n_max;
    const StageDp dp(p);
    const auto& entries = tr.entries;
    for (int64_t budget_buckets : {4, 20, 45, 70, 100, 160}) {
      const int64_t budget = budget_buckets * p.bucket_bytes;
      for (int64_t xtr : {int64_t(0), int64_t(900) << 20}) {
        const auto caps = dp.caps(budget, xtr, xtr / 2);
        for (int n_lo : {1, 2}) {
          // Several rows at once (no entry, and three entry vectors), and each row alone.
          std::vector<std::vector<double>> multi(4), single(4);
          std::vector<StageDp::CostRow> rows;
          for (int r = 0; r < 4; ++r)
            rows.push_back({r == 0 ? nullptr : &entries[size_t(r - 1)], &multi[size_t(r)]});
          dp.best_costs(caps, rows, n_lo, n_max);
          for (int r = 0; r < 4; ++r) {
            dp.best_costs(caps, rows[size_t(r)].entry, n_lo, n_max, single[size_t(r)]);
            for (int n = n_lo; n <= n_max; ++n) {
              const auto a = dp.best_within(n, caps, rows[size_t(r)].entry);
              BOOST_TEST_INFO("trial " << trial << " budget " << budget_buckets << " xtr " << xtr
                                       << " row " << r << " n " << n);
              BOOST_TEST(multi[size_t(r)][size_t(n)] == a.cost);
              BOOST_TEST(single[size_t(r)][size_t(n)] == a.cost);
              ++compared;
              if (a.cost == kInf) continue;
              ++finite;
              const auto ids = dp.reconstruct(n, a);
              BOOST_TEST_REQUIRE(int(ids.size()) == n);
            }
          }
        }
      }
    }
  }
  BOOST_TEST_MESSAGE("rows vs single answers: " << compared << " compared, " << finite
                                                << " finite");
  BOOST_TEST(finite > compared / 4);
  BOOST_TEST(finite < compared);
}

// Several queries at once (each its caps and rows, as the search asks a DP for every caps of a
// configuration in one pass) answer as each alone.
BOOST_AUTO_TEST_CASE(batched_queries_equal_single_answers) {
  std::mt19937_64 rng(20261203);
  int compared = 0, finite = 0;
  for (int trial = 0; trial < 24; ++trial) {
    const Trial tr = make_trial(rng, trial, 2);
    const StageDp dp(tr.problem);
    const int n_max = tr.problem.n_max;
    std::vector<std::vector<int64_t>> caps;
    for (int64_t budget_buckets : {4, 20, 45, 70, 100, 160})
      for (int64_t xtr : {int64_t(0), int64_t(900) << 20})
        caps.push_back(dp.caps(budget_buckets * tr.problem.bucket_bytes, xtr, xtr / 2));
    for (int n_lo : {1, 2}) {
      // Query i: caps[i] with no entry and with entries[i % 2].
      std::vector<std::vector<std::vector<double>>> out(caps.size(),
                                                        std::vector<std::vector<double>>(2));
      std::vector<StageDp::CostQuery> queries;
      for (size_t i = 0; i < caps.size(); ++i)
        queries.push_back({&caps[i], {{nullptr, &out[i][0]}, {&tr.entries[i % 2], &out[i][1]}}});
      dp.best_costs(queries, n_lo, n_max);
      for (size_t i = 0; i < caps.size(); ++i)
        for (int r = 0; r < 2; ++r)
          for (int n = n_lo; n <= n_max; ++n) {
            const auto a = dp.best_within(n, caps[i], r == 0 ? nullptr : &tr.entries[i % 2]);
            BOOST_TEST_INFO("trial " << trial << " query " << i << " row " << r << " n " << n);
            BOOST_TEST(out[i][size_t(r)][size_t(n)] == a.cost);
            ++compared;
            finite += a.cost < kInf;
          }
    }
  }
  BOOST_TEST_MESSAGE("batched vs single answers: " << compared << " compared, " << finite
                                                   << " finite");
  BOOST_TEST(finite > compared / 4);
  BOOST_TEST(finite < compared);
}
