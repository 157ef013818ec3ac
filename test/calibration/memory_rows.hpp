// The published peak-GPU-memory figures (data/calibration/memory.json) as (model, cluster,
// framework, plan) rows, with how each was measured: the forecast compared with a row is the
// one of the same kind (allocated with max_memory_allocated, reserved with max_memory_reserved,
// the whole device with nvidia-smi). Rows the model cannot express (fp8, torch.compile, a
// software or a GPU without a data file, a recompute policy the Plan has no name for) are kept
// with the reason instead of a forecast. Shared by the calibration test and bench_calibration.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "stratagem/cost.hpp"
#include "stratagem/error.hpp"
#include "stratagem/estimate.hpp"
#include "stratagem/interop.hpp"
#include "stratagem/loaders.hpp"
#include "test/calibration/h100_rows.hpp"

namespace stratagem::calibration {

inline std::string memory_file() {
  return std::string(STRATAGEM_SOURCE_DIR) + "/data/calibration/memory.json";
}

// Which of the forecast's peaks a published figure measures.
enum class MemoryKind { allocated, reserved, device };
inline const char* to_string(MemoryKind k) {
  return k == MemoryKind::allocated  ? "allocated"
         : k == MemoryKind::reserved ? "reserved"
                                     : "device";
}

struct MemoryRow {
  Row row;  // model, cluster, framework, plan; row.framework = the file's name
  std::string measured_as;
  MemoryKind kind = MemoryKind::reserved;
  double published_gib = 0;
  bool rank0 = false;  // the source reports rank 0 (the first pipeline stage), not the max
  std::string reason;  // non-empty: the model cannot express this row (why)
};

// The forecast of one kind of one stage's memory breakdown.
inline int64_t forecast_bytes(const MemoryBreakdown& m, MemoryKind k) {
  return k == MemoryKind::allocated  ? m.allocated_bytes()
         : k == MemoryKind::reserved ? m.reserved_bytes()
                                     : m.total_bytes();
}

// `measured_as` as the row states it. A source that does not say which statistic it prints
// (nanotron's benchmark writes both max_memory_allocated and max_memory_reserved) is compared
// with the reserved peak: what the process holds from the allocator, the figure an OOM is
// raised against.
inline MemoryKind memory_kind(const std::string& measured_as, const std::string& id) {
  if (measured_as == "max_memory_allocated") return MemoryKind::allocated;
  if (measured_as == "max_memory_reserved" || measured_as == "not_stated")
    return MemoryKind::reserved;
  if (measured_as == "nvidia-smi") return MemoryKind::device;
  throw InputError(id + ": measured_as '" + measured_as +
                   "' is not max_memory_allocated, max_memory_reserved, nvidia-smi or not_stated");
}

inline std::vector<MemoryRow> load_memory_rows(const std::string& path = memory_file()) {
  std::vector<MemoryRow> out;
  for (const auto& r : read_rows_file(path)) {
    MemoryRow mr;
    Row& row = mr.row;
    row.id = r.at("id").get<std::string>();
    row.framework = r.at("framework").get<std::string>();
    mr.measured_as = r.at("measured_as").get<std::string>();
    mr.kind = memory_kind(mr.measured_as, row.id);
    mr.published_gib = r.at("published_peak_memory_gib").get<double>();
    mr.rank0 = r.value("reported_rank", std::string("max")) == "0";
    row.model = model_shape(r.at("model"), row.id);
    read_architecture(r.at("model"), row.model);
    out.push_back(mr);
    MemoryRow& o = out.back();
    auto skip = [&](const std::string& why) { o.reason = why; };
    if (r.at("fp8").get<bool>()) {
      skip("fp8 linear layers: the tool has no FP8 precision");
      continue;
    }
    if (r.at("cluster").is_null()) {
      const std::string gpu = r.at("gpu").get<std::string>();
      skip("no cluster file for its GPU (" + gpu.substr(0, gpu.find(" at ")) + ")");
      continue;
    }
    if (r.value("torch_compile", false)) {
      skip(
          "torch.compile fuses element-wise ops and changes what is saved for backward; no "
          "framework file describes it");
      continue;
    }
    try {
      o.row.software = load_framework(o.row.framework);
    } catch (const InputError&) {
      skip("no framework file for '" + o.row.framework + "'");
      continue;
    }
    const std::string rc = r.at("recompute").get<std::string>();
    if (rc == "selective-op") {
      skip("torchtitan's op-level selective checkpointing is not a recompute policy of the Plan");
      continue;
    }
    if (r.at("offload").get<std::string>() != "none") {
      skip("offload '" + r.at("offload").get<std::string>() + "' is not read by this loader");
      continue;
    }
    ClusterSpec& c = o.row.cluster;
    c = load_cluster(r.at("cluster").get<std::string>());
    c.nodes = r.at("nodes");
    const int gpus = r.at("gpus").get<int>();
    if (gpus < c.nodes * c.node.gpus_per_node) {
      if (gpus % c.nodes != 0)
        throw InputError(row.id + ": gpus " + std::to_string(gpus) + " not a multiple of nodes");
      interop::restrict_to_gpus(c, gpus / c.nodes, row.id + " gpus");
    }
    if (r.at("micro_batch").is_null()) {
      skip("no micro-batch stated");
      continue;
    }
    const std::string sched = r.at("schedule").get<std::string>();
    if (sched == "interleaved") {
      skip("interleaved schedule without a stated vpp");
      continue;
    }
    PlanShorthand s;
    s.tp = r.at("tp").get<int>(), s.pp = r.at("pp").get<int>(), s.dp = r.at("dp").get<int>();
    s.cp = r.at("cp").get<int>();
    s.micro_batch = r.at("micro_batch").get<int>();
    s.global_batch = r.at("global_batch").get<int>();
    s.zero = r.at("zero_stage").get<int>();
    s.recompute = rc;
    s.dtype = r.at("dtype").get<std::string>();
    s.flash_attention = r.at("flash_attention").get<bool>();
    s.sequence_parallel = r.at("sequence_parallel").get<bool>();
    s.schedule = "1f1b";  // pp = 1, or 1F1B as stated
    try {
      o.row.plan = expand_shorthand(s, o.row.model, c);
      validate(o.row.plan, o.row.model, c, row.id);
      if (r.contains("stage_layers")) {
        const std::string why = detail::apply_stage_layers(r, o.row);
        if (!why.empty()) skip(why);
      }
    } catch (const InputError& e) {
      skip(std::string("the Plan refuses the layout: ") + e.what());
    }
  }
  return out;
}

}  // namespace stratagem::calibration
