// Validation of the zero-bubble schedules' split backward (validate calls it last). What the
// one schedule generator does not split yet is refused here, naming the field, rather than run
// with an unsplit part that the forecast would price as split.
#include <string>

#include "stratagem/error.hpp"
#include "stratagem/plan.hpp"

namespace stratagem {

std::string split_backward_refusal(const ModelSpec& m, int layer, const LayerStrategy& s,
                                   std::string* field) {
  auto no = [&](const char* f, const std::string& why) {
    if (field) *field = f;
    return why;
  };
  if (layer >= 0 && m.is_moe_layer(layer))
    return no("schedule",
              "the split backward of MoE layers (the experts' weight gradients apart from "
              "their input gradients) is not built yet; use 1f1b or interleaved");
  if (m.attention == AttentionKind::mla)
    return no("schedule",
              "the split backward of MLA attention is not built yet; use 1f1b or interleaved");
  if (s.cp > 1)
    return no("cp",
              "the split backward of a context-parallel attention is not built yet; use cp 1 or "
              "schedule 1f1b/interleaved");
  if (s.offload_activations)
    return no("offload",
              "activation offload with a split backward is not built yet (W would read "
              "activations that went to the host)");
  if (s.zero >= 2 && s.dp_cp() > 1)
    return no("zero",
              "ZeRO-2/3 reduce-scatter each micro-batch's gradients, which a deferred W "
              "completes later: not built yet for the split backward; use zero 0 or 1");
  return "";
}

void validate_split_backward(const Plan& p, const ModelSpec& m, const std::string& src) {
  if (!splits_backward(p.schedule)) return;
  std::string field;
  for (int l = 0; l < int(p.layers.size()); ++l) {
    const std::string why = split_backward_refusal(m, l, p.layers[l], &field);
    if (!why.empty())
      throw InputError(src + ": layers[" + std::to_string(l) + "]." + field + ": schedule " +
                       to_string(p.schedule) + ": " + why);
  }
  // The embedding and head keep their backward whole: their ZeRO sharding is the layers'.
  const std::string why = split_backward_refusal(m, -1, p.embedding, &field);
  if (!why.empty())
    throw InputError(src + ": embedding." + field + ": schedule " + to_string(p.schedule) + ": " +
                     why);
}

}  // namespace stratagem
