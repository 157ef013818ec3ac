// Shards: the parameters this rank holds and where. The model part (its weights and gradients
// in the Program's static buffers), the weights of layers that offload them (in the host
// pool), each layer's ZeRO partition (exec/shards.hpp), the device optimizer, and what is
// bound for one use: fetch buffers holding gathered or copied-up weights, staging buffers
// receiving a ZeRO-2/3 layer's gradients.
#pragma once
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "src/runtime/exec/shards.hpp"
#include "stratagem/optimizer.hpp"
#include "stratagem/transformer.hpp"

namespace stratagem::exec {

struct Shards {
  Model model;
  Sharding sharding;
  Tensor host_params;  // the weights of layers that offload them
  std::unique_ptr<AdamW> adamw;
  std::vector<AdamW::Run> adamw_runs;  // the device update, one piece per state run
  // Weights are bound only while a fetch buffer holds them (ZeRO-3 layers, offloaded weights).
  std::map<int, std::vector<const ParamInfo*>> fetched;  // fetch buffer -> tensors bound
  // ZeRO-2/3: per layer (-1: embedding and head) the staging tensors of its flat runs, written
  // by one micro-batch's backward until its reduce-scatter.
  std::map<int, std::vector<std::pair<int64_t, Tensor>>> staging;

  // The weights of flat [flat, flat + n): in model.params, or host_params where offloaded.
  Tensor param_slice(int64_t flat, int64_t n) {
    if (sharding.weights.holds(flat))
      return model.params.slice(sharding.weights.local(flat), Shape{n});
    return host_params.slice(sharding.host_weights.local(flat), Shape{n});
  }
  // (host view, device view) for each run of the host-updated optimizer state: its gradients,
  // or its weights where they stay on the device.
  std::vector<std::pair<Tensor, Tensor>> host_state_pairs(const Tensor& host_like, bool grads) {
    std::vector<std::pair<Tensor, Tensor>> out;
    for (const FlatRun& r : sharding.host_state.runs()) {
      if (!grads && !sharding.weights.holds(r.flat_begin)) continue;
      const int64_t n = r.flat_end - r.flat_begin;
      out.push_back({host_like.slice(r.local, Shape{n}),
                     grads ? model.grads.slice(sharding.grads.local(r.flat_begin), Shape{n})
                           : param_slice(r.flat_begin, n)});
    }
    return out;
  }
  // A fetch buffer's free: the weights it held are unbound.
  void unbind_fetch(int buffer) {
    auto f = fetched.find(buffer);
    if (f == fetched.end()) return;
    for (const ParamInfo* e : f->second) weight_field(model.weights, e->name) = Tensor{};
    fetched.erase(f);
  }
};

}  // namespace stratagem::exec
