// Reporting a deadlock: a Program that stops with unfinished ops and nothing to run. The
// report names each stuck rank's streams, the op each waits at and what it waits for.
#include <sstream>
#include <string>
#include <vector>

#include "sim/engine.hpp"

namespace stratagem::sim {

std::string Engine::describe_stuck(const RankState& r) const {
  const StageData& sd = stages_[r.stage];
  std::ostringstream os;
  os << "rank " << r.rank << " (stage " << r.stage << ")";
  bool first = true;
  for (int s = 0; s < kStreams; ++s) {
    if (stream_done(r, sd, s, iterations_)) continue;
    const uint32_t op = sd.steps[s][r.position[s]].op;
    if (consumed_program_) {
      // The ops were freed at setup (simulate_consuming): positions only.
      os << (first ? ": " : "; ") << to_string(Stream(s)) << " stream at op " << op;
      first = false;
      continue;
    }
    const Op& o = sd.program->ops[op];
    os << (first ? ": " : "; ") << to_string(Stream(s)) << " stream at op " << op << " '"
       << op_name(o) << "'";
    if (iterations_ > 1) os << " (iteration " << r.iteration[s] << ")";
    first = false;
    if (!r.running[s]) {
      std::vector<std::string> waits;
      if (r.position[s] == 0 && r.iteration[s] > 0)
        waits.push_back("the end of the previous iteration");
      const uint32_t* d = sd.program->deps.data() + o.dep_begin;
      for (uint32_t k = 0; k < o.dep_count; ++k) {
        const uint32_t dep = d[k];
        const int sdp = sd.stream_of[dep];
        if (r.iteration[sdp] < r.iteration[s] ||
            (r.iteration[sdp] == r.iteration[s] && r.position[sdp] <= sd.position_of[dep]))
          waits.push_back("op " + std::to_string(dep) + " '" + op_name(sd.program->ops[dep]) + "'");
      }
      os << " waits for ";
      for (size_t i = 0; i < waits.size(); ++i) os << (i ? ", " : "") << waits[i];
      continue;
    }
    switch (o.kind) {
      case OpKind::recv: {
        const Channel& c = r.channels[r.channel_of_key[step_of(sd, op).key]];
        os << " waits for message #" << c.wait_seq << " from rank " << c.peer
           << " (no matching send)";
        break;
      }
      case OpKind::collective: {
        const int g = rank_groups_[r.group_row + step_of(sd, op).key];
        const CollectiveTable& colls = matcher_.collectives();
        const int id = g >= 0 ? colls.instance(g) : -1;
        if (id >= 0 && !colls[id].started) {
          const Coll& c = colls[id];
          os << " waits in " << to_string(o.collective) << " over "
             << to_string(layout_.group(g).kind) << " group [";
          const auto& gr = layout_.group(g).ranks;
          for (size_t i = 0; i < gr.size(); ++i) os << (i ? "," : "") << gr[i];
          os << "]: " << c.arrived << " of " << c.size << " arrived";
          // Only this process's members are known here; other processes name theirs.
          std::vector<int> missing;
          for (int m : gr) {
            if (!pdes_.local(m)) continue;
            bool in = false;
            for (const Member& mm : c.members) in |= mm.rank == m;
            if (!in) missing.push_back(m);
          }
          if (!missing.empty()) {
            os << ", missing";
            for (int m : missing) os << " " << m;
          }
        } else {
          os << " (running)";
        }
        break;
      }
      default:
        os << " (running)";
        break;
    }
  }
  return os.str();
}

std::string deadlock_message(Time last, const std::vector<int>& stuck_ranks, int world,
                             const std::string& desc) {
  // Every process described up to 8 of its stuck ranks; keep the first 8 overall.
  std::string lines;
  size_t at = 0;
  for (int k = 0; k < 8 && at < desc.size(); ++k) {
    const size_t nl = desc.find('\n', at);
    const size_t e = nl == std::string::npos ? desc.size() : nl + 1;
    lines += desc.substr(at, e - at);
    at = e;
  }
  std::ostringstream os;
  os << "the Program deadlocks: at t=" << last << " ns no op can run, but " << stuck_ranks.size()
     << " of " << world << " ranks have unfinished ops:\n"
     << lines;
  if (stuck_ranks.size() > 8) os << "  ... and " << stuck_ranks.size() - 8 << " more ranks\n";
  return os.str();
}

}  // namespace stratagem::sim
