// Megatron-LM command lines: shell splitting, model and plan reading, and every export of the
// plan read (with the nearest plan where a target cannot state it).
#include <string>

#include "stratagem/interop.hpp"
#include "stratagem/loaders.hpp"
#include "test/fuzz/harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stratagem;
  static const ClusterSpec base = load_cluster("dgx-a100-80g");
  const std::string text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_input_errors([&] {
    ClusterSpec c = base;
    const auto tokens = interop::split_command_line(text, "args.txt");
    const interop::MegatronJob job = interop::megatron_job_from_args(tokens, c, "args.txt");
    for (auto t :
         {interop::Target::megatron, interop::Target::torchtitan, interop::Target::deepspeed}) {
      const bool direct = interop::unexpressible(job.plan, job.model, t).empty();
      const Plan p = direct ? job.plan : interop::nearest_expressible(job.plan, job.model, c, t);
      volatile size_t sink = interop::export_plan(p, job.model, c, t).size();
      (void)sink;
    }
  });
  return 0;
}
