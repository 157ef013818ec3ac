// Merging what the MPI processes of a search found.
#include <nlohmann/json.hpp>

#include "src/search/searcher.hpp"

namespace stratagem::search_detail {
namespace {
nlohmann::json pack_candidate(const SearchCandidate& c) {
  return {{"plan", to_json(c.plan)},
          {"key", c.key},
          {"origin", c.origin},
          {"t", c.est_iteration_time_s},
          {"tok", c.est_tokens_per_s},
          {"peak", c.est_peak_memory_bytes},
          {"stages", c.est_stage_peak_bytes}};
}
SearchCandidate unpack_candidate(const nlohmann::json& j, const ModelSpec& m) {
  SearchCandidate c;
  c.plan = plan_from_json(j.at("plan"), m, "search");
  c.key = j.at("key").get<std::string>();
  c.origin = j.at("origin").get<std::string>();
  c.est_iteration_time_s = j.at("t").get<double>();
  c.est_tokens_per_s = j.at("tok").get<double>();
  c.est_peak_memory_bytes = j.at("peak").get<int64_t>();
  c.est_stage_peak_bytes = j.at("stages").get<std::vector<int64_t>>();
  return c;
}
}  // namespace

std::vector<std::string> allgather_strings(MPI_Comm comm, const std::string& mine) {
  if (comm == MPI_COMM_NULL) return {mine};
  int P = 1;
  MPI_Comm_size(comm, &P);
  int len = int(mine.size());
  std::vector<int> lens(P), offs(P, 0);
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, comm);
  int total = 0;
  for (int i = 0; i < P; ++i) offs[i] = total, total += lens[i];
  std::string all(size_t(total), '\0');
  MPI_Allgatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, comm);
  std::vector<std::string> out;
  for (int i = 0; i < P; ++i) out.push_back(all.substr(size_t(offs[i]), size_t(lens[i])));
  return out;
}

std::string Searcher::pack() const {
  nlohmann::json j;
  auto list = [](const TopK& t) {
    nlohmann::json a = nlohmann::json::array();
    for (const auto& c : t.items()) a.push_back(pack_candidate(c));
    return a;
  };
  j["full"] = list(full_);
  j["megatron"] = list(megatron_);
  j["zero"] = list(zero_);
  j["megatron_ep"] = list(megatron_ep_);
  j["minmem"] = min_memory_.best ? pack_candidate(*min_memory_.best) : nlohmann::json();
  j["stats"] = {local_scored_, local_searched_, local_dp_cells_, local_violations_};
  nlohmann::json ev = nlohmann::json::array();
  for (const auto& e : evaluated_.plans())
    ev.push_back(
        {e.tokens_per_s, e.iteration_time_s, e.peak_memory_bytes, e.origin, e.description, e.hash});
  j["evaluated"] = std::move(ev);
  return j.dump();
}

void Searcher::merge(const std::vector<std::string>& parts) {
  if (parts.size() <= 1 && procs_ == 1) {
    stats_.candidates_evaluated = local_scored_;
    stats_.configs_searched = local_searched_;
    stats_.dp_cells = local_dp_cells_;
    stats_.bound_violations = local_violations_;
    return;
  }
  TopK full(o_.top_k), meg(o_.top_k), zero(o_.top_k), meg_ep(o_.top_k);
  MinMemory mm;
  EvaluatedLog ev;
  SearchStats st = stats_;
  st.candidates_evaluated = st.configs_searched = st.dp_cells = st.bound_violations = 0;
  for (const auto& s : parts) {
    const auto j = nlohmann::json::parse(s);
    for (const auto& c : j["full"]) full.offer(unpack_candidate(c, m_));
    for (const auto& c : j["megatron"]) meg.offer(unpack_candidate(c, m_));
    for (const auto& c : j["zero"]) zero.offer(unpack_candidate(c, m_));
    for (const auto& c : j["megatron_ep"]) meg_ep.offer(unpack_candidate(c, m_));
    if (!j["minmem"].is_null()) mm.offer(unpack_candidate(j["minmem"], m_));
    for (const auto& e : j["evaluated"]) {
      EvaluatedPlan x;
      x.tokens_per_s = e[0].get<double>();
      x.iteration_time_s = e[1].get<double>();
      x.peak_memory_bytes = e[2].get<int64_t>();
      x.origin = e[3].get<std::string>();
      x.description = e[4].get<std::string>();
      x.hash = e[5].get<uint64_t>();
      ev.record(x);
    }
    st.candidates_evaluated += j["stats"][0].get<int64_t>();
    st.configs_searched += j["stats"][1].get<int64_t>();
    st.dp_cells += j["stats"][2].get<int64_t>();
    st.bound_violations += j["stats"][3].get<int64_t>();
  }
  full_ = std::move(full);
  megatron_ = std::move(meg);
  zero_ = std::move(zero);
  megatron_ep_ = std::move(meg_ep);
  min_memory_ = std::move(mm);
  evaluated_ = std::move(ev);
  stats_ = st;
}

}  // namespace stratagem::search_detail
