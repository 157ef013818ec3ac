// A job on part of a node (--gpus-per-node): the GPUs' own links stay as they are, the links and
// host the node's GPUs share are divided among them.
#include <algorithm>
#include <cmath>

#include "stratagem/error.hpp"
#include "stratagem/interop.hpp"

namespace stratagem::interop {

void restrict_to_gpus(ClusterSpec& c, int gpus, const std::string& flag) {
  const int g = c.node.gpus_per_node;
  if (gpus < 1 || gpus > g)
    throw InputError(flag + ": expected 1 to " + std::to_string(g) + " (the GPUs of a " + c.name +
                     " node), got " + std::to_string(gpus));
  if (gpus == g) return;
  const double share = double(gpus) / g;
  // Rail-optimised nodes give each GPU its own NIC(s): the job's GPUs bring theirs, so a GPU's
  // share of the network stays what it was (and is never less than one NIC for the job).
  c.node.nic_count = std::max(1, int(std::ceil(c.node.nic_count * share - 1e-9)));
  // The job's GPUs are numbered from 0 (CUDA_VISIBLE_DEVICES=0,1,...), so they fill PCIe
  // switches in order: no more of them than the job has share one switch's uplink.
  c.node.gpus_per_pcie_switch = std::min(c.node.gpus_per_pcie_switch, gpus);
  // The host's cores, memory and memory bandwidth are shared by the node's GPUs; a job on part
  // of the node gets its GPUs' share (as a scheduler's per-GPU allocation gives it).
  c.node.host_memory_bytes = int64_t(double(c.node.host_memory_bytes) * share);
  c.node.host_flops *= share;
  c.node.host_memory_bandwidth_gbps *= share;
  c.node.gpus_per_node = gpus;
  c.description += " [job on " + std::to_string(gpus) + " of the node's " + std::to_string(g) +
                   " GPUs: NICs " + std::to_string(c.node.nic_count) + ", host shared by GPU]";
}

}  // namespace stratagem::interop
