#include "stratagem/cluster.hpp"

#include <algorithm>

#include "stratagem/error.hpp"
#include "stratagem/model.hpp"

namespace stratagem {

const char* to_string(Dtype d) {
  switch (d) {
    case Dtype::fp32:
      return "fp32";
    case Dtype::tf32:
      return "tf32";
    case Dtype::fp16:
      return "fp16";
    case Dtype::bf16:
      return "bf16";
  }
  return "?";
}

Dtype dtype_from_string(const std::string& s, const std::string& where) {
  if (s == "fp32") return Dtype::fp32;
  if (s == "tf32") return Dtype::tf32;
  if (s == "fp16") return Dtype::fp16;
  if (s == "bf16") return Dtype::bf16;
  throw InputError(where + ": expected one of fp32|tf32|fp16|bf16, got '" + s + "'");
}

double GpuSpec::peak_flops(Dtype d) const {
  switch (d) {
    case Dtype::fp32:
      return peak_flops_fp32;
    case Dtype::tf32:
      return peak_flops_tf32;
    case Dtype::fp16:
      return peak_flops_fp16;
    case Dtype::bf16:
      return peak_flops_bf16;
  }
  return peak_flops_fp32;
}

double ClusterSpec::internode_gbps_per_gpu() const {
  double node_gbps = node.nic_count * node.nic.bandwidth_gbps;
  return node_gbps / node.gpus_per_node / std::max(1.0, network.oversubscription);
}

}  // namespace stratagem
