// Timing the runtime's own kernels and collectives on every rank of a node at once.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "stratagem/profile.hpp"

namespace stratagem {
namespace {

double now_s() {
  using C = std::chrono::steady_clock;
  return std::chrono::duration<double>(C::now().time_since_epoch()).count();
}

class Timer {
 public:
  Timer(Backend& be, Communicator& comm, const ProfileOptions& opt)
      : be_(be), comm_(comm), opt_(opt) {}

  // Mean time of `op` (dispatch to completion) over a loop of at least min_time_s, slowest
  // rank. Every rank runs the same number of repetitions, chosen from the slowest rank's first
  // run, so they overlap as the ranks of a training step do. A mean over the whole loop, not a
  // median of single runs: ranks that share cores are descheduled for whole time slices, which
  // a short run can slip between but a training step cannot.
  double mean_s(const std::function<void()>& op, int max_reps = 200) {
    comm_.barrier();
    double first = run_once(op);  // also the warm-up (first touch, caches, thread pool)
    comm_.all_reduce_max(&first, 1);
    const int reps = std::clamp(int(opt_.min_time_s / std::max(first, 1e-9)), 3, max_reps);
    comm_.barrier();
    const double t0 = now_s();
    for (int i = 0; i < reps; ++i) op();
    be_.synchronize();
    double mean = (now_s() - t0) / reps;
    comm_.all_reduce_max(&mean, 1);
    return mean;
  }

 private:
  double run_once(const std::function<void()>& op) {
    const double t0 = now_s();
    op();
    be_.synchronize();
    return now_s() - t0;
  }
  Backend& be_;
  Communicator& comm_;
  const ProfileOptions& opt_;
};

template <class... A>
void progress(const ProfileOptions& opt, Communicator& comm, const char* fmt, A... a) {
  if (!opt.progress || comm.rank() != 0) return;
  std::fprintf(stderr, "profile: ");
  std::fprintf(stderr, fmt, a...);
  std::fprintf(stderr, "\n");
}

Tensor filled(Backend& be, Shape s, float v) {
  Tensor t = be.allocate(s);
  be.fill(t, v);
  return t;
}

// Candidate shapes in ascending FLOPs; the ones that would run longer than max_shape_time_s at
// the best rate seen so far are skipped, so a slow device does not take hours.
std::vector<GemmSample> gemm_shapes(bool quick) {
  const std::vector<int64_t> rows =
      quick ? std::vector<int64_t>{64, 512} : std::vector<int64_t>{32, 128, 512, 2048, 8192};
  const std::vector<int64_t> hidden =
      quick ? std::vector<int64_t>{128, 512} : std::vector<int64_t>{128, 512, 1024, 2048, 4096};
  std::vector<GemmSample> v;
  for (int64_t m : rows)
    for (int64_t h : hidden)
      for (auto [n, k] : {std::pair{h, h}, std::pair{4 * h, h}, std::pair{h, 4 * h}})
        v.push_back({m, n, k, 0});
  std::stable_sort(v.begin(), v.end(), [](const GemmSample& a, const GemmSample& b) {
    return a.m * a.n * a.k < b.m * b.n * b.k;
  });
  return v;
}

std::vector<AttentionSample> attention_shapes(bool quick) {
  std::vector<AttentionSample> v;
  const std::vector<AttentionSample> base =
      quick ? std::vector<AttentionSample>{{1, 128, 4, 32, false, 0}, {1, 512, 4, 64, false, 0}}
            : std::vector<AttentionSample>{{1, 256, 4, 64, false, 0},
                                           {1, 1024, 8, 64, false, 0},
                                           {2, 2048, 16, 64, false, 0},
                                           {1, 4096, 32, 128, false, 0}};
  for (auto s : base)
    for (bool kept : {true, false}) {
      s.probabilities_kept = kept;
      v.push_back(s);
    }
  return v;
}

}  // namespace

ProfileMeasurements measure_profile(Backend& be, Communicator& comm, const ProfileOptions& opt) {
  ProfileMeasurements m;
  m.backend = be.name();
  m.ranks = comm.size();
#ifdef _OPENMP
  m.threads_per_rank = omp_get_max_threads();
#endif
  Timer timer(be, comm, opt);

  {  // launch: a one-element kernel, dispatch to completion
    Tensor a = filled(be, {1}, 1.0f), b = filled(be, {1}, 2.0f), o = be.allocate({1});
    m.launch_s = timer.mean_s([&] { be.residual_forward(o, a, b); }, 2000);
    progress(opt, comm, "launch %.3g s", m.launch_s);
  }

  for (int64_t n : opt.quick ? std::vector<int64_t>{1 << 22, 1 << 23}
                             : std::vector<int64_t>{1 << 22, 1 << 24}) {
    Tensor a = filled(be, {n}, 1.0f), b = filled(be, {n}, 2.0f), o = be.allocate({n});
    StreamSample s{3 * n * int64_t(sizeof(float)), 0};
    s.time_s = timer.mean_s([&] { be.residual_forward(o, a, b); });
    m.stream.push_back(s);
    progress(opt, comm, "stream %lld bytes: %.3g s, %.3g GB/s", (long long)s.bytes, s.time_s,
             s.bytes / s.time_s / 1e9);
  }

  double best_rate = 0;
  const auto shapes = gemm_shapes(opt.quick);
  int idx = 0;
  for (GemmSample s : shapes) {
    ++idx;
    const double flops = 2.0 * s.m * s.n * s.k;
    if (best_rate > 0 && flops / best_rate > opt.max_shape_time_s) continue;
    Tensor inp = filled(be, {s.m, s.k}, 0.01f), w = filled(be, {s.n, s.k}, 0.02f);
    Tensor out = be.allocate({s.m, s.n});
    const Tensor none;
    s.time_s = timer.mean_s([&] { be.matmul_forward(out, inp, w, none); });
    best_rate = std::max(best_rate, flops / s.time_s);
    m.gemm.push_back(s);
    progress(opt, comm, "gemm %d/%d (%lldx%lldx%lld): %.3g s, %.3g FLOP/s", idx, int(shapes.size()),
             (long long)s.m, (long long)s.n, (long long)s.k, s.time_s, flops / s.time_s);
  }

  for (AttentionSample s : attention_shapes(opt.quick)) {
    const double flops = 12.0 * s.batch * s.seq * s.seq * s.heads * s.head_dim;
    if (best_rate > 0 && flops / best_rate > opt.max_shape_time_s) continue;
    const int64_t C = s.heads * s.head_dim;
    Tensor qkv = filled(be, {s.batch, s.seq, 3 * C}, 0.01f);
    Tensor out = be.allocate({s.batch, s.seq, C}), dout = filled(be, {s.batch, s.seq, C}, 0.01f);
    Tensor dqkv = be.allocate({s.batch, s.seq, 3 * C});
    Tensor lse = be.allocate({s.batch, s.heads, s.seq});
    Tensor att = s.probabilities_kept ? be.allocate({s.batch, s.heads, s.seq, s.seq}) : Tensor{};
    const int h = int(s.heads);
    s.time_s = timer.mean_s([&] {
      be.attention_forward(out, att, lse, qkv, h, h);
      be.attention_backward(dqkv, dout, out, qkv, att, lse, h, h);
    });
    m.attention.push_back(s);
    progress(opt, comm, "attention seq %lld heads %lld%s: %.3g s", (long long)s.seq,
             (long long)s.heads, s.probabilities_kept ? "" : " (flash-style)", s.time_s);
  }

  if (comm.size() > 1) {
    const int64_t top = opt.quick ? (4 << 20) : (64 << 20);
    std::vector<float> buf(top / sizeof(float), 1.0f);
    for (int64_t bytes = 4096; bytes <= top; bytes *= 4) {
      CollectiveSample s{bytes, 0};
      s.time_s =
          timer.mean_s([&] { comm.all_reduce_sum(buf.data(), bytes / int64_t(sizeof(float))); });
      m.all_reduce.push_back(s);
      progress(opt, comm, "all-reduce %lld bytes over %d ranks: %.3g s", (long long)bytes,
               comm.size(), s.time_s);
    }
  }

  for (int64_t bytes : opt.quick ? std::vector<int64_t>{16 << 20, 64 << 20}
                                 : std::vector<int64_t>{16 << 20, 64 << 20, 256 << 20}) {
    const int64_t n = bytes / int64_t(sizeof(float));
    std::vector<float> host(n, 1.0f);
    Tensor dev = be.allocate({n});
    CopySample s{bytes, 0};
    s.time_s = timer.mean_s([&] {
      be.upload(dev, host.data());
      be.download(host.data(), dev);
    });
    m.copy.push_back(s);
    progress(opt, comm, "copy %lld bytes up + down: %.3g s", (long long)bytes, s.time_s);
  }
  return m;
}

}  // namespace stratagem
