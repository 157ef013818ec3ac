// Context-parallel attention (src/runtime/context_parallel.cpp, the code the executor runs)
// against one causal attention of the whole sequence in PyTorch (attention_reference.py): the
// output, the log-sum-exp and the gradients of q, k and v of every kind, on as many cp ranks as
// mpirun starts (2 and 4 in tests.cmake). Every rank holds the load-balanced chunks r and
// 2 cp - 1 - r of the sequence and compares its own rows.
#define BOOST_TEST_MODULE cp_attention
#include <mpi.h>
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/runtime/context_parallel.hpp"
#include "stratagem/backend.hpp"
#include "stratagem/comm.hpp"
#include "test/support/fp32_bounds.hpp"
#include "test/support/random_tensors.hpp"
#include "test/support/serial_executor.hpp"

using namespace stratagem;
using MpiSession = test::MpiSession;
BOOST_GLOBAL_FIXTURE(MpiSession);
namespace fs = std::filesystem;

#ifndef STRATAGEM_PYTHON
#define STRATAGEM_PYTHON "/usr/bin/python3"
#endif
#ifndef STRATAGEM_ATTENTION_REFERENCE
#define STRATAGEM_ATTENTION_REFERENCE "attention_reference.py"
#endif

namespace {

// float32 throughout; the reference is float64. The ring's merges reorder the sums: the bound
// is one attention's rounding over the whole sequence (test/support/fp32_bounds.hpp).

struct Problem {
  int64_t B = 2, T = 64, hd = 8;
  int heads = 8, kv_heads = 4;  // GQA; both divide by 4 for the all-to-all kind
  int64_t width() const { return (heads + 2 * kv_heads) * hd; }
};

void write_floats(const fs::path& p, const std::vector<float>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * 4));
  if (!f) throw std::runtime_error("cannot write " + p.string());
}
std::vector<float> read_floats(const fs::path& p, size_t n) {
  std::vector<float> v(n);
  std::ifstream f(p, std::ios::binary);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
  if (!f) throw std::runtime_error("the reference did not write " + p.string());
  return v;
}

// The whole problem and PyTorch's answer, identical on every rank (rank 0 runs the script).
struct Reference {
  Problem p;
  std::vector<float> qkv, dout, out, lse, dqkv;
};
Reference reference() {
  Reference r;
  const Problem& p = r.p;
  r.qkv = test::randn(static_cast<size_t>(p.B * p.T * p.width()), 11);
  r.dout = test::randn(static_cast<size_t>(p.B * p.T * p.heads * p.hd), 12);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string dir;
  if (rank == 0) {
    std::string templ = (fs::temp_directory_path() / "cp_attention_XXXXXX").string();
    if (!mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    dir = templ;
    std::ofstream(fs::path(dir) / "dims.json")
        << "{\"B\":" << p.B << ",\"T\":" << p.T << ",\"heads\":" << p.heads
        << ",\"kv_heads\":" << p.kv_heads << ",\"head_dim\":" << p.hd << "}";
    write_floats(fs::path(dir) / "qkv.f32", r.qkv);
    write_floats(fs::path(dir) / "dout.f32", r.dout);
    const std::string cmd =
        std::string(STRATAGEM_PYTHON) + " " + STRATAGEM_ATTENTION_REFERENCE + " " + dir;
    if (std::system(cmd.c_str()) != 0) dir.clear();
  }
  int len = static_cast<int>(dir.size());
  MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
  dir.resize(static_cast<size_t>(len));
  MPI_Bcast(dir.data(), len, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (dir.empty()) throw std::runtime_error("attention_reference.py failed");
  r.out = read_floats(fs::path(dir) / "out.f32", static_cast<size_t>(p.B * p.T * p.heads * p.hd));
  r.lse = read_floats(fs::path(dir) / "lse.f32", static_cast<size_t>(p.B * p.heads * p.T));
  r.dqkv = read_floats(fs::path(dir) / "dqkv.f32", r.qkv.size());
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) fs::remove_all(dir);
  return r;
}

// The rank's rows of a (B,T,width) array, in its local (load-balanced) order.
std::vector<float> local_rows(const std::vector<float>& full, const Problem& p, int64_t width,
                              const std::vector<int64_t>& positions) {
  std::vector<float> v;
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t pos : positions) {
      const float* row = full.data() + (b * p.T + pos) * width;
      v.insert(v.end(), row, row + width);
    }
  return v;
}

double max_error(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0, scale = 1;
  for (float w : want) scale = std::max(scale, std::abs(static_cast<double>(w)));
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
  return worst / scale;
}

std::vector<float> download(Backend& be, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  be.download(v.data(), t);
  return v;
}

// One pass, op by op in the order of the Program's cp ops (src/core/program_cp.cpp), each
// send and receive posted together and completed before the op after them: what the executor
// does with the Program's dependencies, on one attention alone.
// (The send first: a dK,dV send takes in the accumulator the receive then overwrites.)
template <class Send, class Recv>
void exchange(Send send, Recv recv) {
  RequestPtr s = send().request;
  RequestPtr r = recv().request;
  s->wait();
  r->wait();
}
void run_pass(Backend& be, Communicator& comm, const CpAttention& a, const CpPass::Tensors& t,
              bool backward) {
  CpPass pass(be, comm, a, backward, t);
  const int cp = comm.size();
  if (a.kind == CpKind::ring) {
    // kv 0, then [core j, kv j + 1] (backward also dkv j after core j).
    const int kv_steps = cp - 1;
    auto kv = [&](int j) {
      exchange([&] { return pass.send_kv(j); }, [&] { return pass.recv_kv(j); });
    };
    auto dkv = [&](int j) {
      exchange([&] { return pass.send_dkv(j); }, [&] { return pass.recv_dkv(j); });
    };
    if (kv_steps > 0) kv(0);
    for (int j = 0; j < cp; ++j) {
      pass.core(j);
      if (j + 1 < kv_steps) kv(j + 1);
      if (backward) dkv(j);
    }
  } else {
    pass.before().request->wait();
    pass.core(0);
    if (RequestPtr after = pass.after().request) after->wait();
  }
  pass.finish();
}

void check_kind(CpKind kind) {
  static const Reference ref = reference();
  const Problem& p = ref.p;
  auto comm = make_mpi_communicator(MPI_COMM_WORLD, "cp", 120);
  const int cp = comm->size(), rank = comm->rank();
  auto be = make_cpu_backend();
  const std::vector<int64_t> pos = cp_positions(rank, cp, p.T);
  const int64_t Tl = p.T / cp, C = p.heads * p.hd;
  Tensor qkv = test::host(*be, local_rows(ref.qkv, p, p.width(), pos), Shape{p.B, Tl, p.width()});
  Tensor dout = test::host(*be, local_rows(ref.dout, p, C, pos), Shape{p.B, Tl, C});
  Tensor out = be->allocate(Shape{p.B, Tl, C}), lse = be->allocate(Shape{p.B, p.heads, Tl});
  Tensor dqkv = be->allocate(qkv.shape);
  const CpAttention a{kind, p.heads, p.kv_heads, p.T, {}};
  // a2a keeps its head group's output for the backward.
  Tensor out_heads = kind == CpKind::a2a ? be->allocate(out.shape) : Tensor{};
  run_pass(*be, *comm, a, CpPass::Tensors{qkv, out, lse, out_heads, {}, {}}, false);
  run_pass(*be, *comm, a, CpPass::Tensors{qkv, out, lse, out_heads, dout, dqkv}, true);

  const double out_error = max_error(download(*be, out), local_rows(ref.out, p, C, pos));
  const double dqkv_error = max_error(download(*be, dqkv), local_rows(ref.dqkv, p, p.width(), pos));
  BOOST_TEST_MESSAGE(to_string(kind) << " cp " << cp << " rank " << rank << ": out error "
                                     << out_error << ", dqkv error " << dqkv_error);
  BOOST_TEST(out_error <= stratagem::test::attention_rtol(p.hd, p.T));
  BOOST_TEST(dqkv_error <= stratagem::test::attention_rtol(p.hd, p.T));
  if (kind != CpKind::a2a) {  // a2a keeps the log-sum-exp of its head group, not its rows
    std::vector<float> want;
    for (int64_t b = 0; b < p.B; ++b)
      for (int h = 0; h < p.heads; ++h)
        for (int64_t t : pos) want.push_back(ref.lse[(b * p.heads + h) * p.T + t]);
    const double lse_error = max_error(download(*be, lse), want);
    BOOST_TEST(lse_error <= stratagem::test::attention_rtol(p.hd, p.T));
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(load_balanced_chunks) {
  // Megatron-Core's order: on 4 ranks, rank 1 holds chunks 1 and 6 of 8.
  const CpChunks ch = cp_chunks(1, 4, 64);
  BOOST_TEST(ch.first.row0 == 0);
  BOOST_TEST(ch.first.pos0 == 8);
  BOOST_TEST(ch.second.row0 == 8);
  BOOST_TEST(ch.second.pos0 == 48);
  BOOST_CHECK_THROW(cp_chunks(0, 4, 60), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(ring_equals_one_attention) {
  check_kind(CpKind::ring);
}
BOOST_AUTO_TEST_CASE(allgather_equals_one_attention) {
  check_kind(CpKind::allgather);
}
BOOST_AUTO_TEST_CASE(a2a_equals_one_attention) {
  check_kind(CpKind::a2a);
}
