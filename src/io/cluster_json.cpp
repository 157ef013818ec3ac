// ClusterSpec from and to JSON, and loading a cluster file (see stratagem/spec_json.hpp).
#include <nlohmann/json.hpp>

#include "stratagem/cluster.hpp"
#include "stratagem/error.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/model.hpp"
#include "stratagem/spec_json.hpp"

namespace stratagem {

namespace {
// The least efficiency a cluster file may state. What the bound refuses is zero and below, which
// would make every time infinite; a measured profile of a slow build (a sanitizer build on a
// loaded CPU reaches well under 1% of the nominal peak) is a real, if poor, machine.
constexpr double kMinEfficiency = 1e-4;

LinkSpec read_link(io::JsonReader& r, bool has_efficiency_key, const char* efficiency_key) {
  LinkSpec l;
  l.kind = r.get_string("kind", "");
  l.bandwidth_gbps = r.get_double("bandwidth_gbps", 1e-6, 1e6);
  l.latency_s = r.get_double("latency_s", 0, 1);
  if (has_efficiency_key) l.bus_efficiency = r.get_double(efficiency_key, kMinEfficiency, 1.0, 1.0);
  return l;
}
// gpu.process: every key required where the object is given (a ledger stated in part would
// count some of a process and not the rest).
GpuProcessSpec read_process(io::JsonReader p) {
  GpuProcessSpec g;
  constexpr int kMaxChannels = 64;  // NCCL's MAXCHANNELS is 32 (src/include/device.h); a margin
  g.cuda_context_bytes = p.get_int64("cuda_context_bytes", 0);
  g.cublas_workspace_bytes = p.get_int64("cublas_workspace_bytes", 0);
  {
    auto n = p.object("nccl");
    g.nccl_connection_bytes = n.get_int64("connection_bytes", 0);
    g.nccl_channels_intra = n.get_int("channels_intra", 0, kMaxChannels);
    g.nccl_channels_per_nic = n.get_int("channels_per_nic", 0, kMaxChannels);
    g.nccl_p2p_channels_intra = n.get_int("p2p_channels_intra", 0, kMaxChannels);
    g.nccl_p2p_channels_inter = n.get_int("p2p_channels_inter", 0, kMaxChannels);
    g.nccl_nvls_channels = n.get_int("nvls_channels", 0, kMaxChannels);
    g.nccl_nvls_channel_bytes = n.get_int64("nvls_channel_bytes", 0);
    n.reject_unknown();
  }
  p.reject_unknown();
  return g;
}
}  // namespace

ClusterSpec cluster_from_json(const nlohmann::json& j, const std::string& source) {
  io::JsonReader r(j, source);
  ClusterSpec c;
  c.name = r.get_name("name");
  c.description = r.get_string("description", "");
  c.nodes = r.get_int("nodes", 1, 1 << 20, 1);
  {
    auto g = r.object("gpu");
    c.gpu.name = g.get_name("name");
    auto pf = g.object("peak_flops");
    c.gpu.peak_flops_fp32 = pf.get_double("fp32", 1e6, 1e18);
    c.gpu.peak_flops_tf32 = pf.get_double("tf32", 1e6, 1e18, c.gpu.peak_flops_fp32);
    c.gpu.peak_flops_fp16 = pf.get_double("fp16", 1e6, 1e18, c.gpu.peak_flops_fp32);
    c.gpu.peak_flops_bf16 = pf.get_double("bf16", 1e6, 1e18, c.gpu.peak_flops_fp16);
    pf.reject_unknown();
    c.gpu.hbm_bytes = g.get_int64("hbm_bytes", 1 << 20);
    c.gpu.hbm_bandwidth_gbps = g.get_double("hbm_bandwidth_gbps", 1e-3, 1e6);
    c.gpu.sm_count = g.get_int("sm_count", 1, 1 << 20, 0);  // absent: waves not modeled
    if (g.has("gemm")) {
      auto ge = g.object("gemm");
      c.gpu.gemm_max_efficiency = ge.get_double("max_efficiency", kMinEfficiency, 1.0);
      c.gpu.gemm_half_efficiency_flops = ge.get_double("half_efficiency_flops", 0, 1e15);
      c.gpu.gemm_tile_m = ge.get_int("tile_m", 1, 4096, 128);
      c.gpu.gemm_tile_n = ge.get_int("tile_n", 1, 4096, 128);
      ge.reject_unknown();
    }
    if (g.has("attention")) {
      auto a = g.object("attention");
      c.gpu.attention_flash_efficiency = a.get_double("flash_efficiency", kMinEfficiency, 1.0);
      c.gpu.attention_flash1_efficiency =
          a.has("flash1_efficiency") ? a.get_double("flash1_efficiency", kMinEfficiency, 1.0)
                                     : c.gpu.attention_flash_efficiency;
      c.gpu.attention_standard_efficiency =
          a.get_double("standard_efficiency", kMinEfficiency, 1.0);
      a.reject_unknown();
    }
    c.gpu.memory_efficiency = g.get_double("memory_efficiency", kMinEfficiency, 1.0, 0.85);
    c.gpu.kernel_launch_s = g.get_double("kernel_launch_s", 0, 1, 4e-6);
    c.gpu.compute_comm_interference = g.get_double("compute_comm_interference", 1.0, 10.0, 1.15);
    if (g.has("context_overhead_bytes"))
      throw InputError(g.where("context_overhead_bytes") +
                       ": no longer read; the GPU process ledger gpu.process replaces it "
                       "(data/clusters/README.md)");
    if (g.has("process")) c.gpu.process = read_process(g.object("process"));
    c.gpu.allocator_fragmentation = g.get_double("allocator_fragmentation", 0, 1, 0.05);
    g.reject_unknown();
  }
  {
    auto n = r.object("node");
    c.node.gpus_per_node = n.get_int("gpus_per_node", 1, 1024);
    {
      auto intra = n.object("intra");
      c.node.intra = read_link(intra, true, "allreduce_bus_efficiency");
      c.node.intra.half_bandwidth_bytes =
          intra.has("half_bandwidth_bytes") ? intra.get_int64("half_bandwidth_bytes", 0) : 0;
      intra.reject_unknown();
    }
    {
      auto p = n.object("pcie");
      c.node.pcie_generation = p.get_int("generation", 0, 10, 4);
      c.node.gpus_per_pcie_switch = p.get_int("gpus_per_switch", 1, 1024, 1);
      c.node.pcie = read_link(p, false, "");
      c.node.pcie.kind = "pcie";
      p.reject_unknown();
    }
    c.node.host_memory_bytes = n.get_int64("host_memory_bytes", 0);
    c.node.host_flops = n.get_double("host_flops", 1e6, 1e18);
    c.node.host_memory_bandwidth_gbps = n.get_double("host_memory_bandwidth_gbps", 1e-3, 1e6);
    {
      auto nic = n.object("nics");
      c.node.nic_count = nic.get_int("count", 1, 1024);
      c.node.nic.kind = nic.get_string("kind", "nic");
      c.node.nic.bandwidth_gbps = nic.get_double("bandwidth_gbps", 1e-6, 1e6);
      c.node.nic.latency_s = nic.get_double("latency_s", 0, 1);
      c.node.nic.bus_efficiency = nic.get_double("bus_efficiency", kMinEfficiency, 1.0, 1.0);
      c.node.nic.half_bandwidth_bytes =
          nic.has("half_bandwidth_bytes") ? nic.get_int64("half_bandwidth_bytes", 0) : 0;
      nic.reject_unknown();
    }
    n.reject_unknown();
  }
  {
    auto net = r.object("network");
    c.network.topology = net.get_enum("topology", {"fat-tree"}, "fat-tree");
    c.network.oversubscription = net.get_double("oversubscription", 1.0, 1000.0, 1.0);
    c.network.switch_latency_s = net.get_double("switch_latency_s", 0, 1, 1e-6);
    net.reject_unknown();
  }
  // Provenance of a measured file (stratagem profile): kept for readers, not a model input.
  if (r.has("profile") && !r.raw("profile").is_object())
    r.fail("profile", "an object (written by stratagem profile)");
  r.reject_unknown();
  return c;
}

nlohmann::json to_json(const ClusterSpec& c) {
  auto link = [](const LinkSpec& l) {
    return nlohmann::json{
        {"kind", l.kind}, {"bandwidth_gbps", l.bandwidth_gbps}, {"latency_s", l.latency_s}};
  };
  nlohmann::json intra = link(c.node.intra);
  intra["allreduce_bus_efficiency"] = c.node.intra.bus_efficiency;
  intra["half_bandwidth_bytes"] = c.node.intra.half_bandwidth_bytes;
  nlohmann::json pcie = link(c.node.pcie);
  pcie.erase("kind");
  pcie["generation"] = c.node.pcie_generation;
  pcie["gpus_per_switch"] = c.node.gpus_per_pcie_switch;
  return {{"name", c.name},
          {"description", c.description},
          {"nodes", c.nodes},
          {"gpu",
           {{"name", c.gpu.name},
            {"peak_flops",
             {{"fp32", c.gpu.peak_flops_fp32},
              {"tf32", c.gpu.peak_flops_tf32},
              {"fp16", c.gpu.peak_flops_fp16},
              {"bf16", c.gpu.peak_flops_bf16}}},
            {"hbm_bytes", c.gpu.hbm_bytes},
            {"hbm_bandwidth_gbps", c.gpu.hbm_bandwidth_gbps},
            {"sm_count", c.gpu.sm_count},
            {"gemm",
             {{"max_efficiency", c.gpu.gemm_max_efficiency},
              {"half_efficiency_flops", c.gpu.gemm_half_efficiency_flops},
              {"tile_m", c.gpu.gemm_tile_m},
              {"tile_n", c.gpu.gemm_tile_n}}},
            {"attention",
             {{"flash_efficiency", c.gpu.attention_flash_efficiency},
              {"flash1_efficiency", c.gpu.attention_flash1_efficiency},
              {"standard_efficiency", c.gpu.attention_standard_efficiency}}},
            {"memory_efficiency", c.gpu.memory_efficiency},
            {"kernel_launch_s", c.gpu.kernel_launch_s},
            {"compute_comm_interference", c.gpu.compute_comm_interference},
            {"process",
             {{"cuda_context_bytes", c.gpu.process.cuda_context_bytes},
              {"cublas_workspace_bytes", c.gpu.process.cublas_workspace_bytes},
              {"nccl",
               {{"connection_bytes", c.gpu.process.nccl_connection_bytes},
                {"channels_intra", c.gpu.process.nccl_channels_intra},
                {"channels_per_nic", c.gpu.process.nccl_channels_per_nic},
                {"p2p_channels_intra", c.gpu.process.nccl_p2p_channels_intra},
                {"p2p_channels_inter", c.gpu.process.nccl_p2p_channels_inter},
                {"nvls_channels", c.gpu.process.nccl_nvls_channels},
                {"nvls_channel_bytes", c.gpu.process.nccl_nvls_channel_bytes}}}}},
            {"allocator_fragmentation", c.gpu.allocator_fragmentation}}},
          {"node",
           {{"gpus_per_node", c.node.gpus_per_node},
            {"intra", intra},
            {"pcie", pcie},
            {"host_memory_bytes", c.node.host_memory_bytes},
            {"host_flops", c.node.host_flops},
            {"host_memory_bandwidth_gbps", c.node.host_memory_bandwidth_gbps},
            {"nics",
             {{"count", c.node.nic_count},
              {"kind", c.node.nic.kind},
              {"bandwidth_gbps", c.node.nic.bandwidth_gbps},
              {"latency_s", c.node.nic.latency_s},
              {"bus_efficiency", c.node.nic.bus_efficiency},
              {"half_bandwidth_bytes", c.node.nic.half_bandwidth_bytes}}}}},
          {"network",
           {{"topology", c.network.topology},
            {"oversubscription", c.network.oversubscription},
            {"switch_latency_s", c.network.switch_latency_s}}}};
}

ClusterSpec load_cluster(const std::string& name_or_path) {
  std::string path = resolve_data_file(name_or_path, "clusters", "--cluster");
  return cluster_from_json(io::read_json_file(path), path);
}

}  // namespace stratagem
