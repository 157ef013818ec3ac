// Trace files: what every rank did in one or more iterations, as an HDF5 file. The simulator
// writes them with source = "simulated"; the runtime writes the same schema with "measured", so
// a simulated and a measured run can be compared op by op. Schema: sim/README.md.
//
//   /                      attributes: model, cluster, plan (JSON text), tool_version, source,
//                          schema_version, plus any the writer adds (iterations, ...)
//   /ranks/<r>/ops         compound table, one row per executed op (OpRecord)
//   /ranks/<r>/memory      compound table, one row per allocation event (MemorySample)
//
// The writer is serial (one process writes; callers gather to it), so a file does not depend on
// how many processes produced it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "stratagem/program.hpp"

namespace stratagem::trace {

inline constexpr int kNameBytes = 48;  // fixed-length, NUL-padded op name
inline constexpr int kSchemaVersion = 1;

struct OpRecord {
  char name[kNameBytes] = {};  // op_name(op), truncated to 47 characters
  uint8_t kind = 0;            // OpKind (HDF5 enum with the same names)
  uint8_t stream = 0;          // Stream (HDF5 enum)
  int32_t microbatch = -1;
  int32_t layer = -1;
  int32_t iteration = 0;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t bytes = 0;
  double flops = 0;
};

struct MemorySample {
  int64_t time_ns = 0;
  int64_t bytes[kNumMemCategories] = {};  // in use per MemCategory (weights .. buffers)
  int64_t total_bytes = 0;                // device bytes: categories + context + fragmentation
  int64_t high_water_bytes = 0;           // max of total_bytes so far
};

// Fills an OpRecord's descriptive fields from a Program op.
OpRecord make_record(const Op& op, int iteration, int64_t start_ns, int64_t end_ns);

// Written to a temporary name beside `path` and renamed into place by close(), as every output
// is (stratagem/output_file.hpp): a failed write (a full disk) leaves the previous trace at `path`
// as it was, and no half-written or empty file under the name.
class Writer {
 public:
  explicit Writer(const std::string& path);  // creates the temporary file; throws on failure
  ~Writer();  // without close(): closes and removes the temporary file (errors are swallowed)
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void set_attribute(const std::string& name, const std::string& value);
  void set_attribute(const std::string& name, int64_t value);
  // Appends rows to /ranks/<rank>/ops and /ranks/<rank>/memory (created on first use).
  void add_rank_ops(int rank, const std::vector<OpRecord>& ops);
  void add_memory_samples(int rank, const std::vector<MemorySample>& samples);
  // Closes, seals the digest, syncs and renames the file into place; throws on failure.
  void close();

 private:
  int64_t file_ = -1;  // hid_t
  std::string path_;   // the trace's name, in every message
  std::string tmp_;    // the file being written; empty once renamed into place
};

class Reader {
 public:
  explicit Reader(const std::string& path);  // throws InputError naming the file
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  bool has_attribute(const std::string& name) const;
  std::string attribute(const std::string& name) const;  // string attributes ("" if absent)
  int64_t int_attribute(const std::string& name) const;
  std::vector<int> ranks() const;  // sorted
  std::vector<OpRecord> ops(int rank) const;
  std::vector<MemorySample> memory(int rank) const;

 private:
  int64_t file_ = -1;
  std::string path_;
  // Written without a digest, so not verified before libhdf5 reads it: every libhdf5 call on
  // it runs in a child process, bounded in time (stratagem/hdf5_guard.hpp), and file_ stays -1.
  bool unverified_ = false;
  // What is left of the bound on libhdf5's time in an unverified file (all children together).
  mutable double hdf5_budget_s_ = 0;
  // Runs body(file) on the open file, or for an unverified one in a child process.
  template <class Body>
  auto read(Body&& body) const;
};

// Chrome trace-event JSON (chrome://tracing, Perfetto): one process per rank (pid = rank), one
// thread per stream (tid = Stream), "ph":"X" events with ts/dur in microseconds, process_name /
// thread_name metadata and a "memory" counter per rank. Written atomically.
void export_chrome(const std::string& h5_path, const std::string& json_path);

}  // namespace stratagem::trace
