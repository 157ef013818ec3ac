// ClusterSpec: the modeled machine (GPUs, nodes, fabrics, network), from data/clusters/*.json.
// Every figure carries its unit in its name; the JSON files cite the datasheet for each.
#pragma once
#include <cstdint>
#include <string>

namespace stratagem {

enum class Dtype : uint8_t { fp32, tf32, fp16, bf16 };
const char* to_string(Dtype d);
Dtype dtype_from_string(const std::string& s, const std::string& where);
// Storage bytes of one element (tf32 is stored as fp32). Inline: the estimator's inner loops
// call it per layer.
inline int dtype_bytes(Dtype d) {
  return d == Dtype::fp16 || d == Dtype::bf16 ? 2 : 4;
}

// What a CUDA training process holds on a GPU beside its tensors: the GPU process ledger
// (data/clusters/README.md, "The GPU process ledger"; the cost model's process_memory). Every
// figure is per GPU and software generation and has its source in the cluster file. Zero where
// a file states none: the ledger then counts nothing.
struct GpuProcessSpec {
  // The CUDA context (driver state and the kernel images loaded into it), outside the caching
  // allocator.
  int64_t cuda_context_bytes = 0;
  // The cuBLAS and cuBLASLt workspaces the framework gives the stream its GEMMs run on, taken
  // from the caching allocator (counted as allocated).
  int64_t cublas_workspace_bytes = 0;
  // NCCL, outside the caching allocator: the buffers of one channel to one peer (every protocol's
  // receive buffer and the send side's, each rounded to NCCL's allocation granularity).
  int64_t nccl_connection_bytes = 0;
  int nccl_channels_intra = 0;      // channels of a collective communicator inside one node
  int nccl_channels_per_nic = 0;    // of one spanning nodes: per NIC its ranks on a node reach
  int nccl_p2p_channels_intra = 0;  // channels of point-to-point traffic to a peer on the node
  int nccl_p2p_channels_inter = 0;  // to a peer on another node
  // NVLink SHARP (NVLS): channels per communicator and the buffers of one channel per head rank
  // (every rank of the communicator on the node is a head); 0 channels where the GPU has none.
  int nccl_nvls_channels = 0;
  int64_t nccl_nvls_channel_bytes = 0;
};

struct GpuSpec {
  std::string name;
  double peak_flops_fp32 = 0, peak_flops_tf32 = 0, peak_flops_fp16 = 0, peak_flops_bf16 = 0;
  int64_t hbm_bytes = 0;
  double hbm_bandwidth_gbps = 0;
  // Calibration of achieved efficiency (see data/clusters/README.md).
  int sm_count = 0;  // GEMM wave quantization; 0 = unknown (tile quantization only)
  double gemm_max_efficiency = 0.8;
  double gemm_half_efficiency_flops = 2e9;
  int gemm_tile_m = 128, gemm_tile_n = 128;
  double attention_flash_efficiency = 0.55;
  // The same for a first-generation FlashAttention kernel (the 2022 algorithm: FlashAttention-1
  // in CUDA, or its Triton port) on this GPU, for a framework that runs one
  // (FrameworkSpec::attention_kernel). Where a cluster file states none: the flash figure.
  double attention_flash1_efficiency = 0.55;
  double attention_standard_efficiency = 0.35;
  double memory_efficiency = 0.85;
  double kernel_launch_s = 4e-6;
  // Slowdown of compute kernels while a collective or send of the same GPU moves data beside
  // them (NCCL kernels take SMs, HBM and L2); see data/clusters/README.md for the sources.
  double compute_comm_interference = 1.15;
  GpuProcessSpec process;
  // The caching allocator's rounding and fragmentation: reserved minus allocated bytes, as a
  // fraction of the allocated bytes.
  double allocator_fragmentation = 0.05;

  double peak_flops(Dtype d) const;
};

struct LinkSpec {
  std::string kind;
  double bandwidth_gbps = 0;  // GB/s per direction, per GPU (intra) or per NIC
  double latency_s = 0;
  double bus_efficiency = 1.0;  // achieved fraction of bandwidth for large collectives
  // Message size at which a transfer reaches half of its large-message bandwidth (0 = no ramp).
  int64_t half_bandwidth_bytes = 0;
};

struct NodeSpec {
  int gpus_per_node = 1;
  LinkSpec intra;  // NVSwitch / NVLink / shared memory
  LinkSpec pcie;   // host <-> device per GPU
  int pcie_generation = 4;
  // GPUs whose host copies share one PCIe switch's uplink to the CPU (each gets its share of
  // the pcie bandwidth: offloading from every GPU at once is what training does).
  int gpus_per_pcie_switch = 1;
  int64_t host_memory_bytes = 0;
  double host_flops = 0;
  double host_memory_bandwidth_gbps = 0;
  int nic_count = 1;
  LinkSpec nic;  // one NIC
};

struct NetworkSpec {
  std::string topology = "fat-tree";
  double oversubscription = 1.0;  // >= 1: bisection is divided by this
  double switch_latency_s = 1e-6;
};

struct ClusterSpec {
  std::string name;
  std::string description;
  int nodes = 1;
  GpuSpec gpu;
  NodeSpec node;
  NetworkSpec network;

  int world_size() const { return nodes * node.gpus_per_node; }
  // Inter-node bandwidth available to one GPU (its share of the node's NICs, after
  // oversubscription), GB/s per direction.
  double internode_gbps_per_gpu() const;
};

// Loading a cluster from a file is io's part: stratagem/loaders.hpp.

}  // namespace stratagem
