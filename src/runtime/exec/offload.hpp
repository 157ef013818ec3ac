// Offloading (ZeRO-Offload, ZeRO-Infinity, H3T): the host pool, with a ledger of its own apart
// from the device's; the optimizer of the layers that offload theirs, which runs on the host;
// and the Program's copy streams (exec/ops_offload.cpp).
#pragma once
#include <memory>
#include <vector>

#include "src/runtime/exec/copy_stream.hpp"
#include "src/runtime/exec/memory.hpp"
#include "stratagem/optimizer.hpp"

namespace stratagem::exec {

struct Offload {
  explicit Offload(Backend& device)
      : ledger(std::make_shared<MemoryLedger>()), pool(device, ledger) {}

  std::shared_ptr<MemoryLedger> ledger;
  BufferPool pool;
  int next_buffer = 0;
  std::unique_ptr<AdamW> adamw;  // the state of layers that offload it
  std::vector<AdamW::Run> adamw_runs;
  std::unique_ptr<Backend> backend;  // the host's kernels, used on the d2h stream only
  Tensor master;                     // the state's weights AdamW updates on the host
  Tensor grads;                      // the gradients copied down for it (both as the state)
  bool master_stale = false;         // device weights changed outside a step (checkpoint load)
  bool update_pending = false;       // this step's norm was finite: the host updates
  float lr = 0;
  // Last, so that they are drained and joined before the tensors their work touches go.
  CopyStream h2d{"h2d"}, d2h{"d2h"};

  // A tensor resident in the host pool for the whole run.
  Tensor tensor(MemCategory category, Shape shape) {
    const int id = next_buffer++;
    pool.alloc(id, category, shape.numel() * int64_t(sizeof(float)));
    return pool.take(id, shape);
  }
};

}  // namespace stratagem::exec
