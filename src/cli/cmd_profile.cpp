#include <mpi.h>

#include <cstdio>
#include <nlohmann/json.hpp>

#include "src/cli/command.hpp"
#include "src/cli/launch.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/output_file.hpp"
#include "stratagem/profile.hpp"

namespace stratagem::cli {
namespace {

void print_summary(const ProfileFit& f, const ProfileMeasurements& m) {
  const GpuSpec &a = f.base.gpu, &b = f.cluster.gpu;
  const LinkSpec &ia = f.base.node.intra, &ib = f.cluster.node.intra;
  std::printf("profile: %s backend, %d rank(s) x %d thread(s), compute in %s\n", m.backend.c_str(),
              m.ranks, m.threads_per_rank, m.compute_dtype.c_str());
  std::printf("  %-36s %14s %14s\n", "field", "file", "measured");
  auto row = [](const char* name, double x, double y) {
    std::printf("  %-36s %14.4g %14.4g\n", name, x, y);
  };
  row("gpu.gemm.max_efficiency", a.gemm_max_efficiency, b.gemm_max_efficiency);
  row("gpu.gemm.half_efficiency_flops", a.gemm_half_efficiency_flops, b.gemm_half_efficiency_flops);
  row("gpu.attention.standard_efficiency", a.attention_standard_efficiency,
      b.attention_standard_efficiency);
  row("gpu.attention.flash_efficiency", a.attention_flash_efficiency, b.attention_flash_efficiency);
  row("gpu.memory_efficiency", a.memory_efficiency, b.memory_efficiency);
  row("gpu.kernel_launch_s", a.kernel_launch_s, b.kernel_launch_s);
  if (!m.all_reduce.empty()) {
    row("node.intra.latency_s", ia.latency_s, ib.latency_s);
    row("node.intra.allreduce_bus_efficiency", ia.bus_efficiency, ib.bus_efficiency);
    row("node.intra.half_bandwidth_bytes", double(ia.half_bandwidth_bytes),
        double(ib.half_bandwidth_bytes));
  }
  row("node.pcie.bandwidth_gbps", f.base.node.pcie.bandwidth_gbps,
      f.cluster.node.pcie.bandwidth_gbps);
  for (const auto& s : f.adjusted) std::printf("  adjusted: %s\n", s.c_str());
  std::printf("  cost model error (typical |model/measured - 1|), file -> measured:\n");
  auto err = [](const char* name, double x, double y, bool any) {
    if (any) std::printf("    %-12s %7.1f%% -> %5.1f%%\n", name, x, y);
  };
  err("gemm", f.before.gemm_error_pct, f.after.gemm_error_pct, !m.gemm.empty());
  err("attention", f.before.attention_error_pct, f.after.attention_error_pct, !m.attention.empty());
  err("stream", f.before.stream_error_pct, f.after.stream_error_pct, !m.stream.empty());
  err("all-reduce", f.before.all_reduce_error_pct, f.after.all_reduce_error_pct,
      !m.all_reduce.empty());
  err("copy", f.before.copy_error_pct, f.after.copy_error_pct, !m.copy.empty());
  for (const auto& s : f.not_measured) std::printf("  not measured: %s\n", s.c_str());
}

int run_profile(Args& a) {
  const bool json = a.flag("--json");
  const auto out = a.output("-o");
  const std::string backend_name = a.value("--backend").value_or("cpu");
  ProfileOptions opt;
  opt.quick = a.flag("--quick");
  opt.min_time_s = a.double_value("--min-time-s").value_or(opt.quick ? 0.03 : 0.1);
  opt.max_shape_time_s = a.double_value("--max-shape-time-s").value_or(opt.quick ? 0.05 : 0.5);
  const std::string cluster_arg = a.value("--cluster").value_or("cpu-local");
  a.input("--cluster", cluster_arg, resolve_data_file(cluster_arg, "clusters", "--cluster"));
  ClusterSpec base = load_cluster(cluster_arg);
  a.finish();
  if (opt.min_time_s <= 0 || opt.min_time_s > 60)
    throw InputError(a.command() + ": --min-time-s: expected a value in (0, 60] seconds");
  if (opt.max_shape_time_s <= 0)
    throw InputError(a.command() + ": --max-shape-time-s: expected > 0 seconds");
  if (backend_name == "cuda")
    throw NotSupported(
        "--backend cuda: profile times collectives on host buffers and fits a CPU description; "
        "timing the CUDA backend's kernels and NCCL on device buffers is not implemented yet "
        "(train --backend cuda runs); only --backend cpu runs");
  if (backend_name != "cpu")
    throw InputError(a.command() + ": --backend: expected cpu|cuda, got '" + backend_name + "'");
  if (base.gpu.name != "cpu")
    throw InputError(a.command() + ": --backend cpu times this node's CPU cores, but --cluster " +
                     cluster_arg + " describes " + base.gpu.name +
                     " devices; profile a CPU description (gpu.name \"cpu\", e.g. cpu-local)");
  // Checked before any measurement, so that a wrong job fails in seconds.
  const int local = local_size();
  if (local != world_size())
    throw InputError(a.command() + ": profile measures one node, but MPI started " +
                     std::to_string(world_size()) + " ranks of which " + std::to_string(local) +
                     " share this node; run it on one node (sbatch --nodes=1)");
  if (world_size() > base.node.gpus_per_node)
    throw InputError(a.command() + ": " + std::to_string(world_size()) + " ranks but --cluster " +
                     cluster_arg + " has " + std::to_string(base.node.gpus_per_node) +
                     " devices per node: run at most one rank per device");
  check_launch(a.command());

  opt.progress = !json;
  auto backend = make_cpu_backend();
  auto comm = make_mpi_communicator(MPI_COMM_WORLD);
  const ProfileMeasurements m = measure_profile(*backend, *comm, opt);
  const ProfileFit fit = fit_profile(base, m);
  const nlohmann::json file = profile_cluster_json(fit, m, cluster_arg);
  if (world_rank() == 0 && out) io::write_output("-o", *out, file.dump(2) + "\n");
  if (json) {
    nlohmann::json j = file["profile"];
    for (const char* k : {"gemm", "attention", "stream", "all_reduce", "copy"}) j.erase(k);
    j["cluster_file"] = out ? *out : "";
    print_json(j);
  } else if (world_rank() == 0) {
    print_summary(fit, m);
    if (out)
      std::printf("wrote %s: use --cluster %s with simulate, estimate and search\n", out->c_str(),
                  out->c_str());
  }
  return 0;
}

Register reg{
    {"profile", "measure this node's kernels and collectives and write a measured cluster file",
     "usage: mpirun -np G stratagem profile [--cluster NAME|FILE.json] [-o measured.json]\n"
     "                      [--backend cpu] [--quick] [--min-time-s 0.1]\n"
     "                      [--max-shape-time-s 0.5] [--json]\n"
     "  One rank per device of ONE node. Times GEMMs, attention, a memory stream, kernel\n"
     "  launch, all-reduce over the node's ranks and host<->device copies with the runtime's\n"
     "  own backend, then fits the cluster file's calibration fields so that the cost model\n"
     "  reproduces them. The written file is --cluster's file with those fields replaced and a\n"
     "  'profile' section: raw samples, model predictions before and after, fit errors, and\n"
     "  the fields that one node cannot measure (NICs, network), which keep the file's values.\n"
     "  --cluster        the description to start from [cpu-local]; with --backend cpu its\n"
     "                   gpu.name must be \"cpu\" (CPU cores are not fitted to a GPU file)\n"
     "  --quick          fewer shapes and shorter repetitions (tests)\n"
     "  --backend cuda   not implemented yet (the CUDA backend trains; profiling it does not)\n",
     run_profile}};

}  // namespace
}  // namespace stratagem::cli
