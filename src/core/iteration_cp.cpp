// Context parallelism's communication rule (iteration.hpp's CpComm).
#include "stratagem/iteration.hpp"

namespace stratagem {

CpComm cp_comm(const ModelSpec& m, const LayerStrategy& s, int samples, Phase ph, Dtype dt) {
  CpComm c;
  if (s.cp <= 1) return c;
  const int64_t e = dtype_bytes(dt);
  const int64_t tokens = int64_t(samples) * (m.seq_len / s.cp);
  c.kv_bytes = e * tokens * 2 * m.kv_hidden() / s.tp;
  const bool bwd = ph == Phase::backward;
  switch (s.cp_kind) {
    case CpKind::ring:
      c.kv_steps = s.cp - 1;
      c.dkv_steps = bwd ? s.cp : 0;
      // The block at hand and the one arriving; backward the same for dK, dV.
      c.buffer_bytes = (bwd ? 4 : 2) * c.kv_bytes;
      break;
    case CpKind::allgather:
      c.before = Collective::all_gather;
      c.before_bytes = s.cp * c.kv_bytes;
      if (bwd) c.after = Collective::reduce_scatter, c.after_bytes = s.cp * c.kv_bytes;
      // The gathered K and V; backward also the whole dK, dV before their reduce-scatter.
      c.buffer_bytes = (bwd ? 2 : 1) * s.cp * c.kv_bytes;
      break;
    case CpKind::a2a: {
      const int64_t qkv = e * tokens * (m.hidden + 2 * m.kv_hidden()) / s.tp;
      const int64_t out = e * tokens * m.hidden / s.tp;
      c.before = c.after = Collective::all_to_all;
      c.before_bytes = bwd ? out : qkv;
      c.after_bytes = bwd ? qkv : out;
      // The head-split copies of Q, K, V and of the output (or their gradients).
      c.buffer_bytes = qkv + out;
      break;
    }
  }
  // A forward that keeps nothing (full recompute: its recompute rebuilds the block) still holds
  // the block's Q, K, V, output and log-sum-exp (fp32) while its core and transfers run, over
  // several ops: they are working memory beside the kind's.
  if (ph == Phase::forward && s.recompute == Recompute::full) {
    const int64_t q_width = int64_t(m.heads) * m.head_dim();
    c.buffer_bytes += e * tokens * (2 * q_width + 2 * m.kv_hidden()) / s.tp +
                      4 * int64_t(samples) * (m.heads / s.tp) * (m.seq_len / s.cp);
  }
  return c;
}

}  // namespace stratagem
