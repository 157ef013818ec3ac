// GEMMs through cuBLASLt: the linear layers and attention's batched products share one
// wrapper. Row-major tensors are handed to cuBLAS (column-major) as their transposes, so
//   out (N,OC) = inp (N,C) @ W^T  becomes  out^T (OC x N) = W^T... in column-major terms
// as each call below spells out.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "src/runtime/cuda/check.hpp"
#include "src/runtime/cuda/cuda_backend.hpp"
#include "src/runtime/cuda/device_ops.hpp"
#include "src/runtime/cuda/kernels.hpp"
#include "src/runtime/kernel_checks.hpp"

namespace stratagem::cuda {
namespace {
// RAII for the descriptor objects of one cublasLtMatmul call.
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  ~LtDescs() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The alignment cuBLASLt may assume for a matrix (and each of its batch): the largest power
// of two up to 256 dividing its address and its batch stride in bytes. The executor carves
// tensors out of arenas at any float offset, so 4 is possible and must be declared.
uint32_t alignment(const void* p, int64_t stride_bytes) {
  uint64_t a = reinterpret_cast<uintptr_t>(p) | static_cast<uint64_t>(stride_bytes) | 256u;
  return static_cast<uint32_t>(a & (~a + 1));
}

void set_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  if (batch <= 1) return;
  const int32_t count = static_cast<int32_t>(batch);
  STRATAGEM_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                        &count, sizeof count));
  STRATAGEM_CUDA_CHECK(cublasLtMatrixLayoutSetAttribute(
      l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
}
}  // namespace

void CudaBackend::gemm(int64_t m, int64_t n, int64_t k, const GemmOperand& a, const GemmOperand& b,
                       float* c, int64_t ldc, int64_t stride_c, int64_t batch, float alpha,
                       float beta, const float* bias) {
  if (m == 0 || n == 0 || batch == 0) return;
  const bool half = compute_ == ScalarType::bf16;
  const cudaDataType_t ab_type = half ? CUDA_R_16BF : CUDA_R_32F;
  // The bf16 copies of A and B (autocast): dense, same layout as the fp32 operands.
  Tensor a16, b16;
  const void* pa = a.data;
  const void* pb = b.data;
  auto span_of = [&](const GemmOperand& o) { return o.stride * (batch - 1) + o.ld * o.cols; };
  if (half) {
    a16 = scratch(Shape{span_of(a)}, ScalarType::bf16);
    b16 = scratch(Shape{span_of(b)}, ScalarType::bf16);
    launch_to_bf16(a16.bf16_data(), a.data, span_of(a), stream_);
    launch_to_bf16(b16.bf16_data(), b.data, span_of(b), stream_);
    pa = a16.raw();
    pb = b16.raw();
  }
  LtDescs d;
  // fp32 GEMMs stay fp32 (no TF32): the CPU comparison at 1e-5 needs it.
  STRATAGEM_CUDA_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  STRATAGEM_CUDA_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
  STRATAGEM_CUDA_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
  STRATAGEM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.a, ab_type, a.rows, a.cols, a.ld));
  STRATAGEM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.b, ab_type, b.rows, b.cols, b.ld));
  STRATAGEM_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.c, CUDA_R_32F, m, n, ldc));
  set_batch(d.a, batch, a.stride);
  set_batch(d.b, batch, b.stride);
  set_batch(d.c, batch, stride_c);
  (void)k;  // implied by the operands' shapes; cuBLASLt checks them
  const size_t eb = half ? 2 : 4;
  cublasLtMatmulPreference_t pref = nullptr;
  STRATAGEM_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } guard{pref};
  const uint32_t align[3] = {alignment(pa, batch > 1 ? a.stride * eb : 0),
                             alignment(pb, batch > 1 ? b.stride * eb : 0),
                             alignment(c, batch > 1 ? stride_c * 4 : 0)};
  const cublasLtMatmulPreferenceAttributes_t keys[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    STRATAGEM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, keys[i], &align[i < 3 ? i : 2],
                                                              sizeof(uint32_t)));
  STRATAGEM_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof workspace_bytes_));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(lt_, d.op, d.a, d.b, d.c, d.c, pref, 1, &heuristic, &found);
  if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
    STRATAGEM_CUDA_CHECK(cublasLtMatmul(lt_, d.op, &alpha, pa, d.a, pb, d.b, &beta, c, d.c, c, d.c,
                                        &heuristic.algo, workspace_, workspace_bytes_, stream_));
  } else {
    // cuBLASLt offers nothing for some leading dimensions and alignments (odd ld in bf16, a
    // tensor at an odd float offset): classic cuBLAS takes any.
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) STRATAGEM_CUDA_CHECK(st);
    STRATAGEM_CUDA_CHECK(cublasGemmStridedBatchedEx(
        blas_, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, pa,
        ab_type, static_cast<int>(a.ld), a.stride, pb, ab_type, static_cast<int>(b.ld), b.stride,
        &beta, c, CUDA_R_32F, static_cast<int>(ldc), stride_c, static_cast<int>(batch),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  // The bias is added by a kernel rather than the GEMM's epilogue: it may sit at any float
  // offset of the parameter arena, which the epilogue does not allow.
  if (bias) launch_add_bias(c, bias, n, m, stream_);
}

void CudaBackend::matmul_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                                 const Tensor& bias) {
  const auto [N, C, OC] = checks::linear_dims("matmul_forward", inp, weight, out, "out");
  if (bias.defined()) expect_shape(bias, Shape{OC}, "matmul_forward", "bias");
  DeviceOps ops{*this, {}};
  matmul_forward_steps(ops, N, C, OC, inp.data, weight.data, bias.data, out.data);
}

void CudaBackend::matmul_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight) {
  const auto [N, C, OC] = checks::linear_dims("matmul_backward", inp, weight, dout, "dout");
  if (dweight.defined()) expect_shape(dweight, weight.shape, "matmul_backward", "dweight");
  if (dbias.defined()) expect_shape(dbias, Shape{OC}, "matmul_backward", "dbias");
  if (dinp.defined()) expect_shape(dinp, inp.shape, "matmul_backward", "dinp");
  DeviceOps ops{*this, {}};
  matmul_backward_steps(ops, N, C, OC, dout.data, inp.data, weight.data, dinp.data, dweight.data,
                        dbias.data);
}

}  // namespace stratagem::cuda
