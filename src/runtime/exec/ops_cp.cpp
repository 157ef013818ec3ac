// A context-parallel attention's ops on this rank (src/core/program_cp.cpp): its parts (pre,
// the core's steps, post) and the cp group's transfers between them, each run when the Program
// reaches it, as the simulator times them. The pass (context_parallel.hpp's CpPass) keeps what
// the ops share; ops_compute.cpp runs pre and post around it.
#include "src/runtime/exec/ops_cp.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "src/runtime/context_parallel.hpp"
#include "src/runtime/exec/dispatch.hpp"
#include "src/runtime/exec/rank_context.hpp"

namespace stratagem::exec {

int CpOps::work_buffer(const Op& op) const {
  auto work = rank_.buffers.cp_work.find({int(op.phase), op.layer, op.microbatch});
  if (work == rank_.buffers.cp_work.end())
    throw std::logic_error("executor: no cp working buffer for " + op_name(op));
  return work->second;
}

CpRun& CpOps::run_of(const Op& op) {
  LayerState& ls = rank_.mb(op.microbatch).layers.at(op.layer);
  CpRun& run = ls.cp;
  if (run.pass && run.phase == op.phase) return run;
  // The pass's first op: forward's pre (the QKV projection has run), backward's post (the
  // output's gradient is in the workspace) or the all-gather before it.
  const int id = work_buffer(op);
  CpScratch scratch = [this, id](Shape shape) { return rank_.buffers.pool.take(id, shape); };
  const LayerShare& sh = rank_.share(op.layer);
  const AttentionActs& a = ls.attn;
  CpPass::Tensors t{a.qkv, a.out, a.lse, a.out_heads, {}, {}};
  const bool backward = op.phase == Phase::backward;
  if (backward) {
    const AttentionGrads d = attention_grads(sh.local, *sh.ws, sh.samples, rank_.T);
    t.dout = d.d_attn, t.dqkv = d.d_qkv;
  }
  run = CpRun{};
  run.phase = op.phase;
  run.work = id;
  run.pass = std::make_shared<CpPass>(rank_.backend, *rank_.sequence.comm,
                                      cp_attention(sh.local, rank_.sequence, scratch), backward, t);
  run.kv_sends.assign(size_t(rank_.sequence.cp), -1);
  run.dkv_sends.assign(size_t(rank_.sequence.cp), -1);
  return run;
}

void CpOps::core(const Op& op) {
  CpRun& run = run_of(op);
  const int step = std::max<int>(op.cp_step, 0);
  // The dK,dV this step writes are where the previous step's send reads.
  if (step > 0) dispatcher_.complete(run.dkv_sends[size_t(step - 1)]);
  run.pass->core(step);
}

void CpOps::finish(const Op& op) {
  LayerState& ls = rank_.mb(op.microbatch).layers.at(op.layer);
  run_of(op).pass->finish();
  ls.cp = CpRun{};
}

void CpOps::transfer(const Op& op, int index) {
  CpRun& run = run_of(op);
  CpPass& pass = *run.pass;
  // The Program's `part` says which side of the core a transfer is on (program_cp.cpp): pre,
  // the K,V blocks and the collective the core waits for; core, the dK,dV accumulators and the
  // collective after it.
  const bool before = op.part == AttentionPart::pre;
  const size_t step = size_t(std::max<int>(op.cp_step, 0));
  CpTransfer t;
  switch (op.kind) {
    case OpKind::send:
      t = before ? pass.send_kv(int(step)) : pass.send_dkv(int(step));
      (before ? run.kv_sends : run.dkv_sends)[step] = index;
      break;
    case OpKind::recv:
      // Into the block the send before last read.
      if (before && step > 0) dispatcher_.complete(run.kv_sends[step - 1]);
      t = before ? pass.recv_kv(int(step)) : pass.recv_dkv(int(step));
      break;
    case OpKind::collective:
      t = before ? pass.before() : pass.after();
      break;
    default:
      throw std::logic_error("executor: a cp op of kind " + std::string(to_string(op.kind)));
  }
  if (!t.request)
    throw std::logic_error("executor: the cp pass has no transfer for " + op_name(op));
  rank_.requests.issue(index, std::move(t.request));
  rank_.current_step.moved_bytes = t.bytes;  // into the trace, beside the Program's count
  // The free of the pass's working buffer waits for the transfer.
  rank_.buffers.users[run.work].push_back(index);
}

}  // namespace stratagem::exec
