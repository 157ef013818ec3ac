// The parts of a context-parallel attention block (workload.hpp's AttentionPart).
#include <stdexcept>

#include "stratagem/workload.hpp"

namespace stratagem {

const char* to_string(AttentionPart p) {
  static const char* n[] = {"whole", "pre", "core", "post"};
  return n[static_cast<int>(p)];
}

BlockWork attention_part_work(const ModelSpec& m, const LayerStrategy& s, AttentionPart part,
                              int samples, bool flash) {
  if (part == AttentionPart::whole) return forward_work(m, s, Block::attention, samples, flash);
  if (part == AttentionPart::core) {
    BlockWork w = attention_core_work(m, s, samples, flash);
    const int steps = cp_core_steps(s);
    w.attention_flops /= steps;
    w.elementwise_bytes /= steps;
    return w;
  }
  // The same terms as forward_work's attention, each in the part that runs it.
  const BlockWork whole = forward_work(m, s, Block::attention, samples, flash);
  const double e = 2;
  const int64_t T = int64_t(samples) * (m.seq_len / s.cp);
  const int64_t Tn = s.sequence_parallel ? T / s.tp : T;
  const int64_t h = m.hidden, kvh = m.kv_hidden();
  BlockWork w;
  if (part == AttentionPart::pre) {
    w.add(whole.gemms[0]);                  // QKV projection
    w.elementwise_bytes += e * Tn * h * 2;  // norm read + write
    w.kernels += 1;
    if (m.position == Position::rope) {
      w.elementwise_bytes += e * T * (h + kvh) / s.tp * 2;
      w.kernels += 1;
    }
  } else if (part == AttentionPart::post) {
    w.add(whole.gemms[whole.num_gemms - 1]);  // output projection
    w.elementwise_bytes += e * Tn * h * 3;    // dropout + residual: read 2, write 1
    w.kernels += 1;
  } else {
    throw std::logic_error("attention_part_work: unknown part");
  }
  return w;
}

}  // namespace stratagem
