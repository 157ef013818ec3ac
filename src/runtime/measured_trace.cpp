// The runtime's trace: the same schema and writer as the simulator's, with wall-clock times.
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "stratagem/executor.hpp"
#include "stratagem/spec_json.hpp"
#include "stratagem/trace.hpp"
#include "stratagem/version.hpp"

namespace stratagem {

namespace {
// Gathers a vector of trivially copyable records from every rank to rank 0.
template <class T>
std::vector<std::vector<T>> gather(MPI_Comm comm, const std::vector<T>& mine) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int bytes = static_cast<int>(mine.size() * sizeof(T));
  std::vector<int> counts(size), displs(size);
  MPI_Gather(&bytes, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm);
  int total = 0;
  for (int r = 0; r < size; ++r) displs[r] = total, total += rank == 0 ? counts[r] : 0;
  std::vector<char> all(rank == 0 ? total : 0);
  MPI_Gatherv(mine.data(), bytes, MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE, 0,
              comm);
  std::vector<std::vector<T>> out;
  if (rank != 0) return out;
  for (int r = 0; r < size; ++r) {
    std::vector<T> v(counts[r] / sizeof(T));
    std::memcpy(v.data(), all.data() + displs[r], counts[r]);
    out.push_back(std::move(v));
  }
  return out;
}
}  // namespace

void write_measured_trace(MPI_Comm comm, const std::string& path, const ModelSpec& model,
                          const ClusterSpec& cluster, const Plan& plan, const Program& program,
                          int stage, const StepResult& step) {
  std::vector<trace::OpRecord> ops;
  const StageProgram& sp = program.stages.at(stage);
  for (const auto& t : step.timings) {
    ops.push_back(trace::make_record(sp.ops.at(t.op_index), 0, t.start_ns, t.end_ns));
    if (t.moved_bytes >= 0) ops.back().bytes = t.moved_bytes;
  }
  std::vector<trace::MemorySample> mem;
  int64_t high = 0;
  for (const auto& s : step.memory) {
    trace::MemorySample m;
    m.time_ns = s.time_ns;
    for (int c = 0; c < kNumMemCategories; ++c)
      m.bytes[c] = s.bytes_in_use[c], m.total_bytes += s.bytes_in_use[c];
    high = std::max(high, m.total_bytes);
    m.high_water_bytes = high;
    mem.push_back(m);
  }
  auto all_ops = gather(comm, ops);
  auto all_mem = gather(comm, mem);
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    // The Writer writes a temporary file and renames it into place (or removes it on error).
    trace::Writer w(path);
    w.set_attribute("model", to_json(model).dump());
    w.set_attribute("cluster", to_json(cluster).dump());
    w.set_attribute("plan", to_json(plan).dump());
    w.set_attribute("tool_version", std::string(kVersion));
    w.set_attribute("source", std::string("measured"));
    w.set_attribute("clock", std::string("wall-clock ns from the start of the step"));
    w.set_attribute("iterations", int64_t(1));
    w.set_attribute("step", step.step);
    w.set_attribute("world_size", int64_t(all_ops.size()));
    for (size_t r = 0; r < all_ops.size(); ++r) {
      w.add_rank_ops(static_cast<int>(r), all_ops[r]);
      w.add_memory_samples(static_cast<int>(r), all_mem[r]);
    }
    w.close();
  }
  MPI_Barrier(comm);
}

}  // namespace stratagem
