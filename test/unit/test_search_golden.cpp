// Golden answers of the strategy search (SimGrid style): on a few cases, from small to the
// GPT-3 175B / 64 A100 benchmark, the search's best plan, its re-ranked list and its baselines
// must equal what test/search/golden/search.json records. The search is pruned and memoized for
// speed; none of that may change an answer, and a change that does shows up as a diff of the
// golden file in review.
//
// Regenerate (only for a change that is meant to change answers, in a commit that says why):
//   STRATAGEM_UPDATE_GOLDEN=1 build/unit_test_search_golden
#define BOOST_TEST_MODULE search_golden
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stratagem/loaders.hpp"
#include "stratagem/search.hpp"
#include "test/support/small_models.hpp"

using namespace stratagem;

namespace {

const char* kGoldenPath = STRATAGEM_SOURCE_DIR "/test/search/golden/search.json";

struct GoldenCase {
  const char* name;
  // Built-in model and cluster names; an empty model name: test::small_model(8 layers).
  const char* model;
  const char* cluster;
  int nodes;
  int gpus_per_node;  // 0: the cluster file's
  int global_batch;
  double budget_gib;  // 0: the GPU's memory
  bool simulate;      // re-rank with the simulator (else the estimator ranks)
};

const GoldenCase kCases[] = {
    {"small GPT, 8 layers, 8 A100-80GB", "", "dgx-a100-80g", 1, 8, 64, 6, true},
    {"BERT-Huge-32, 8 A100-40GB, 8 GiB", "bert-huge-32", "dgx-a100-40g", 1, 0, 64, 8, true},
    {"GPT-3 6.7B, 8 A100-40GB, 11 GiB", "gpt3-6.7b", "dgx-a100-40g", 1, 0, 128, 11, true},
    {"LLaMA-2-70B, 64 A100-80GB", "llama2-70b", "dgx-a100-80g", 8, 0, 1024, 0, false},
    {"GPT-3 175B, 64 A100-80GB (the search benchmark)", "gpt3-175b", "dgx-a100-80g", 8, 0, 1536, 0,
     true},
};

nlohmann::json candidate(const SearchCandidate& c) {
  return {{"key", c.key},
          {"description", c.plan.describe()},
          {"origin", c.origin},
          {"scored_by", c.simulated ? "simulator" : "estimator"},
          {"tokens_per_s", c.tokens_per_s()},
          {"est_tokens_per_s", c.est_tokens_per_s},
          {"peak_memory_bytes", c.peak_memory_bytes()}};
}

nlohmann::json answer(const GoldenCase& gc) {
  ModelSpec m = *gc.model ? load_model(gc.model) : test::small_model(8, 2048);
  ClusterSpec c = load_cluster(gc.cluster);
  c.nodes = gc.nodes;
  if (gc.gpus_per_node) c.node.gpus_per_node = gc.gpus_per_node;
  SearchOptions o;
  o.global_batch = gc.global_batch;
  o.memory_budget_bytes = static_cast<int64_t>(gc.budget_gib * double(int64_t(1) << 30));
  o.rerank_with_simulator = gc.simulate;
  const SearchResult r = search(m, c, o);
  nlohmann::json ranked = nlohmann::json::array();
  for (const auto& x : r.ranked) ranked.push_back(candidate(x));
  auto base = [](const std::optional<SearchCandidate>& b) {
    return b ? candidate(*b) : nlohmann::json(nullptr);
  };
  return {{"scorer", r.scorer},
          {"best", candidate(r.best)},
          {"ranked", ranked},
          {"megatron", base(r.megatron)},
          {"zero", base(r.zero)}};
}

// Keys and texts equal; figures equal to 1e-9 relative (the scorers are deterministic: this
// only absorbs the printing of doubles).
void compare(const nlohmann::json& want, const nlohmann::json& got, const std::string& where) {
  if (want.is_number() && got.is_number()) {
    const double a = want.get<double>(), b = got.get<double>();
    BOOST_TEST(std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b)),
               where << ": " << got << " (golden " << want << ")");
    return;
  }
  if (want.is_object() && got.is_object()) {
    BOOST_TEST(want.size() == got.size(), where << ": fields differ");
    for (auto it = want.begin(); it != want.end(); ++it) {
      BOOST_TEST_REQUIRE(got.contains(it.key()), where << "." << it.key() << " missing");
      compare(it.value(), got[it.key()], where + "." + it.key());
    }
    return;
  }
  if (want.is_array() && got.is_array()) {
    BOOST_TEST_REQUIRE(want.size() == got.size(),
                       where << ": " << got.size() << " entries (golden " << want.size() << ")");
    for (size_t i = 0; i < want.size(); ++i)
      compare(want[i], got[i], where + "[" + std::to_string(i) + "]");
    return;
  }
  BOOST_TEST(want == got, where << ": " << got.dump() << " (golden " << want.dump() << ")");
}

}  // namespace

BOOST_AUTO_TEST_CASE(search_answers_equal_the_golden_file) {
  const bool update = std::getenv("STRATAGEM_UPDATE_GOLDEN") != nullptr;
  nlohmann::json golden = nlohmann::json::object();
  if (!update) {
    std::ifstream in(kGoldenPath);
    BOOST_TEST_REQUIRE(bool(in), "cannot read " << kGoldenPath);
    in >> golden;
  }
  nlohmann::json fresh = nlohmann::json::object();
  for (const auto& gc : kCases) {
    BOOST_TEST_CONTEXT(gc.name) {
      const nlohmann::json got = answer(gc);
      fresh[gc.name] = got;
      BOOST_TEST_MESSAGE(gc.name << ": best " << got["best"]["tokens_per_s"].get<double>()
                                 << " tokens/s, " << got["best"]["description"].get<std::string>());
      if (update) continue;
      BOOST_TEST_REQUIRE(golden.contains(gc.name), "no golden answer for this case");
      compare(golden[gc.name], got, gc.name);
    }
  }
  if (update) {
    std::ofstream out(kGoldenPath);
    out << fresh.dump(2) << "\n";
    BOOST_TEST_MESSAGE("wrote " << kGoldenPath);
  }
}
