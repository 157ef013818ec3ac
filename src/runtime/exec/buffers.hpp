// Buffers and arenas: the Program's buffers as arenas in the device pool (exec/memory.hpp),
// which buffer holds what (found by the use the Program allocated it for), which ops still
// read a buffer, and the backward's scratch.
#pragma once
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

#include "src/runtime/exec/memory.hpp"
#include "src/runtime/exec/scratch_arena.hpp"
#include "stratagem/program.hpp"
#include "stratagem/transformer.hpp"

namespace stratagem::exec {

struct Buffers {
  explicit Buffers(Backend& backend)
      : ledger(std::make_shared<MemoryLedger>()), pool(backend, ledger) {}

  std::shared_ptr<MemoryLedger> ledger;
  BufferPool pool;
  std::map<int, int> static_buffers;  // setup buffers, resident across steps: id -> category
  std::map<std::tuple<int, int, int, int>, int> by_use;  // (block, phase, layer, mb) -> id
  std::map<int, int> staging;     // layer (-1: embedding and head) -> its staged gradients
  std::set<int> received_pieces;  // buffers the Program names on its reduce-scatters
  // A context-parallel attention's working buffer (program_cp.cpp), by (phase, layer, mb): it
  // shares its use with the block's activations, so it is found apart.
  std::map<std::tuple<int, int, int>, int> cp_work;
  std::map<int, std::vector<int>> users;  // buffer -> ops whose completion reads it
  // The backward's scratch: one set of views per tp degree, carved from one arena.
  std::map<int, Workspace> workspaces;
  std::map<int, TransformerConfig> scratch_config;  // the tp share each scratch set is for
  std::set<int> dense_ffn_degrees;  // the tp degrees of the held dense FFNs (d_fc1, d_act)
  int64_t moe_scratch_floats = 0;   // the held MoE layers' largest expert path transients
  Tensor scratch_arena;
  // The MoE layers' transients, in the arena past the attention's views (where a dense
  // layer's d_fc1 and d_act lie: one layer's backward runs at a time).
  ScratchArena moe_scratch;

  // The live buffer the Program allocated for (block, phase, layer, mb): throws when none.
  int of(Block b, Phase ph, int layer, int mb) const;
  // The same, or -1.
  int find(Block b, Phase ph, int layer, int mb) const;
  // Op `op`'s completion reads the live buffer of (block, phase, layer, mb), if there is one:
  // its free waits for that completion.
  void read_by(Block b, Phase ph, int layer, int mb, int op) {
    const int id = find(b, ph, layer, mb);
    if (id >= 0) users[id].push_back(op);
  }
  // Records what an alloc op's buffer holds, and forgets it at its free.
  void allocated(const Op& op);
  void freed(const Op& op);
};

}  // namespace stratagem::exec
