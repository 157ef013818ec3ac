// FrameworkSpec from and to JSON, and loading a framework file (see stratagem/spec_json.hpp).
#include <nlohmann/json.hpp>

#include "stratagem/framework.hpp"
#include "stratagem/json_reader.hpp"
#include "stratagem/loaders.hpp"
#include "stratagem/model.hpp"
#include "stratagem/spec_json.hpp"

namespace stratagem {

FrameworkSpec framework_from_json(const nlohmann::json& j, const std::string& source) {
  io::JsonReader r(j, source);
  FrameworkSpec f;
  f.name = r.get_name("name");
  f.description = r.get_string("description", "");
  {
    auto g = r.object("gradients");
    f.wgrad_accumulation_fused = g.get_bool("wgrad_accumulation_fused");
    f.grad_accumulation_bytes = g.get_int("accumulation_bytes", 2, 4);
    f.layer_gradient_staging = g.get_bool("layer_gradient_staging", false);
    // 0 (the plan's dtype), 2 (bf16/fp16) or 4 (fp32).
    f.grad_reduce_bytes = g.get_int("reduce_bytes", 0, 4, 0);
    if (f.grad_reduce_bytes % 2 != 0) g.fail("reduce_bytes", "0, 2 or 4");
    f.grad_buffer_bytes = g.get_int("buffer_bytes", 0, 4, 0);
    if (f.grad_buffer_bytes % 2 != 0) g.fail("buffer_bytes", "0, 2 or 4");
    f.pre_reduce_bytes_per_param = g.get_double("pre_reduce_bytes_per_param", 0.0, 1000.0, 0.0);
    g.reject_unknown();
  }
  if (r.has("communication")) {
    auto c = r.object("communication");
    f.tp_comm_overlap = c.get_bool("tp_comm_overlap", false);
    c.reject_unknown();
  }
  if (r.has("attention")) {
    auto a = r.object("attention");
    const std::string k = a.get_string("kernel", "flash");
    if (k == "flash1") {
      f.attention_kernel = AttentionKernel::flash1;
    } else if (k != "flash") {
      a.fail("kernel", "\"flash\" or \"flash1\"");
    }
    a.reject_unknown();
  }
  if (r.has("loss")) {
    auto l = r.object("loss");
    f.loss_forward_bytes_per_logit = l.get_double("forward_bytes_per_logit", 0.0, 1000.0, 0.0);
    f.loss_backward_bytes_per_logit = l.get_double("backward_bytes_per_logit", 0.0, 1000.0, 0.0);
    f.loss_transient_bytes_per_logit = l.get_double("transient_bytes_per_logit", 0.0, 1000.0, 0.0);
    l.reject_unknown();
  }
  if (r.has("optimizer")) {
    auto o = r.object("optimizer");
    f.optimizer_bytes_per_param = o.get_double("bytes_per_param", 0.0, 1000.0, 0.0);
    o.reject_unknown();
  }
  if (r.has("host")) {
    auto h = r.object("host");
    f.host_ops_per_layer_forward = h.get_double("ops_per_layer_forward", 0.0, 1e5, 0.0);
    f.host_ops_per_layer_backward = h.get_double("ops_per_layer_backward", 0.0, 1e5, 0.0);
    f.host_seconds_per_op = h.get_double("seconds_per_op", 0.0, 0.01, 0.0);
    h.reject_unknown();
  }
  r.reject_unknown();
  return f;
}

FrameworkSpec load_framework(const std::string& name_or_path) {
  const std::string path = resolve_data_file(name_or_path, "frameworks", "--framework");
  return framework_from_json(io::read_json_file(path), path);
}

nlohmann::json to_json(const FrameworkSpec& f) {
  return {{"name", f.name},
          {"description", f.description},
          {"gradients",
           {{"wgrad_accumulation_fused", f.wgrad_accumulation_fused},
            {"accumulation_bytes", f.grad_accumulation_bytes},
            {"layer_gradient_staging", f.layer_gradient_staging},
            {"reduce_bytes", f.grad_reduce_bytes},
            {"buffer_bytes", f.grad_buffer_bytes},
            {"pre_reduce_bytes_per_param", f.pre_reduce_bytes_per_param}}},
          {"communication", {{"tp_comm_overlap", f.tp_comm_overlap}}},
          {"attention", {{"kernel", to_string(f.attention_kernel)}}},
          {"loss",
           {{"forward_bytes_per_logit", f.loss_forward_bytes_per_logit},
            {"backward_bytes_per_logit", f.loss_backward_bytes_per_logit},
            {"transient_bytes_per_logit", f.loss_transient_bytes_per_logit}}},
          {"optimizer", {{"bytes_per_param", f.optimizer_bytes_per_param}}},
          {"host",
           {{"ops_per_layer_forward", f.host_ops_per_layer_forward},
            {"ops_per_layer_backward", f.host_ops_per_layer_backward},
            {"seconds_per_op", f.host_seconds_per_op}}}};
}

}  // namespace stratagem
