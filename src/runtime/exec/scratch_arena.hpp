// A first-fit allocator over one preallocated region of the workspace arena. An MoE layer's
// transients (the dispatched rows, the experts' gradients) live across its ops and vary with
// the routing, so they cannot be fixed views as the dense backward's are; a device runtime
// carves them from its workspace rather than allocating each one, and so does this. The
// region is sized by the forecast's rule (moe_expert_workspace_bytes). What does not fit is
// allocated beside it, and the excess stays counted in the ledger, as a caching allocator
// keeps the block it grew by: a forecast that is short shows at every later memory sample.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "src/runtime/exec/memory.hpp"

namespace stratagem::exec {

// Which end of the region a tensor is carved from. Transients that outlive the op that makes
// them (the rows an op hands to the next) come from the top, the op's own from the bottom, so
// that an op's scratch, freed when it returns, never leaves a hole under what lives on.
enum class ArenaEnd { low, high };

class ScratchArena {
 public:
  ScratchArena() = default;
  // `region` is a non-owning view the arena hands out pieces of; `be` allocates what does
  // not fit, counted in `ledger` under buffers.
  ScratchArena(Tensor region, Backend& be, std::shared_ptr<MemoryLedger> ledger);
  bool defined() const { return state_ != nullptr; }
  // A tensor of `shape`, held until the last view of it is dropped (thread-safe: a copy
  // stream's worker may drop it).
  Tensor take(Shape shape, ArenaEnd end = ArenaEnd::low);
  int64_t capacity_bytes() const;
  // The most bytes ever held beside the region at once (0 when the forecast's size held).
  int64_t overflow_bytes() const;
  // The most bytes ever live at once, in the region and beside it.
  int64_t peak_bytes() const;

 private:
  struct State {
    std::mutex mu;
    Tensor region;
    Backend* be = nullptr;
    std::shared_ptr<MemoryLedger> ledger;
    std::map<int64_t, int64_t> free_floats;  // offset -> length, coalesced
    int64_t beside_bytes = 0, beside_high_bytes = 0;
    int64_t live_bytes = 0, live_high_bytes = 0;
    void took(int64_t bytes);
    void release(int64_t offset, int64_t floats);
  };
  std::shared_ptr<State> state_;
};

}  // namespace stratagem::exec
