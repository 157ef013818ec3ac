// Heterogeneous (tp, dp) per layer: the residual stream between consecutive layers whose
// data-parallel degree differs. Under (tp, dp) a micro-batch's samples are split over dp
// replicas; a rank's replica is its stage index / tp (Layout). Where dp shrinks by r (tp grows
// by r), the r ranks of one reshard group (the same tp index in r neighbouring replicas, which
// together form one wider replica) all-gather their samples, in replica order (the Program's
// reshard collective). Where dp grows by r, each rank takes its slice of its replica's samples:
// no transfer. In backward the gradient goes the other way: sliced where forward gathered (the
// wider layer's tp ranks all hold the whole gradient of its samples), gathered where forward
// sliced. A sequence-parallel layer holds the stream as a tp 1 layer does (rank i of the stage:
// piece i of the stage's micro-batch; LayerStrategy::stream_tp), so the same gathers and slices
// serve it: from or to a tp 1 or another sequence-parallel layer nothing moves. The comm
// handler's (ops_comm.hpp): the gathers are its collectives, the slices their counterpart.
#include <stdexcept>
#include <string>

#include "src/runtime/exec/dispatch.hpp"
#include "src/runtime/exec/ops_comm.hpp"
#include "src/runtime/exec/ops_compute.hpp"
#include "src/runtime/exec/rank_context.hpp"

namespace stratagem::exec {

namespace {
// This rank's slice of `t`, which holds r times the samples `layer` takes: replica
// local / (tp * r) of the wider layout holds replicas k * r .. k * r + r - 1 of `layer`'s.
Tensor slice_samples(const Tensor& t, int64_t need, int local, int tp, const std::string& what) {
  const int64_t have = t.numel();
  if (have == need) return t;
  if (have < need || have % need)
    throw std::logic_error("executor: " + what + " holds " + std::to_string(have) +
                           " values where " + std::to_string(need) +
                           " are needed: a reshard is missing");
  const int64_t r = have / need;
  const int64_t x = (local % (int64_t(tp) * r)) / tp;
  return t.slice(x * need, Shape{need});
}
}  // namespace

void CommOps::fit_flow(Flow& f, int layer) {
  if (!f.defined()) return;
  const int64_t need = rank_.stream_shape(layer).numel();
  if (f.base.numel() == need) return;
  if (f.producer >= 0) dispatcher_.complete(f.producer);
  f.producer = -1;
  const std::string what = "the input of layer " + std::to_string(layer);
  const int local = rank_.parallel.coords().local, tp = rank_.stream_tp(layer);
  f.base = slice_samples(f.base.view(Shape{f.base.numel()}), need, local, tp, what);
  if (f.add.defined())
    f.add = slice_samples(f.add.view(Shape{f.add.numel()}), need, local, tp, what);
}

void CommOps::fit_grad(Micro& m, int layer) {
  if (m.grad_producer >= 0) dispatcher_.complete(m.grad_producer);
  const int64_t need = rank_.stream_shape(layer).numel();
  if (!m.grad.defined() || m.grad.numel() == need) return;
  m.grad = slice_samples(m.grad.view(Shape{m.grad.numel()}), need, rank_.parallel.coords().local,
                         rank_.stream_tp(layer), "the gradient of layer " + std::to_string(layer));
}

void CommOps::reshard(const Op& op, int index) {
  Communicator& comm = rank_.group_of(op);
  Micro& m = rank_.mb(op.microbatch);
  const int r = op.reshard_to_tp / op.reshard_from_tp;  // replicas gathered into one
  // op.layer: the layer the stream is gathered for (forward: the next; backward: the previous).
  const int64_t need = rank_.stream_shape(op.layer).numel();
  Tensor src;
  if (op.phase == Phase::backward) {
    if (m.grad_producer >= 0) dispatcher_.complete(m.grad_producer);
    src = m.grad;
  } else {
    src = compute_.materialize(m.fwd, -1, Shape{m.fwd.base.numel()});
  }
  if (src.numel() * r != need)
    throw std::logic_error("executor: " + op_name(op) + " gathers " + std::to_string(r) + " x " +
                           std::to_string(src.numel()) + " values for layer " +
                           std::to_string(op.layer) + ", which takes " + std::to_string(need));
  Tensor gathered = rank_.buffers.pool.scratch(rank_.stream_shape(op.layer));
  rank_.requests.issue(index, comm.iall_gather(src.data, gathered.data, src.numel()), [src] {});
  if (op.phase == Phase::backward) {
    m.grad = gathered;
    m.grad_producer = index;
  } else {
    m.fwd = Flow{gathered, {}, index};
  }
}

}  // namespace stratagem::exec
