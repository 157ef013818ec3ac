// Small numeric helpers shared by the CPU kernels (internal).
#pragma once
#include <cmath>
#include <cstdint>
#include <string>

// GCC 12 reports false -Wmaybe-uninitialized inside Eigen's AVX-512 transpose intrinsics
// (it cannot see that every lane is written); silence it for Eigen only, before any
// intrinsics header is seen, and for the rest of these translation units.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <Eigen/Core>

#include "src/runtime/kernel_checks.hpp"
#include "stratagem/kernel_math.hpp"
#include "stratagem/tensor.hpp"

namespace stratagem::cpu {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstMatMap = Eigen::Map<const RowMat>;
// A row-major block whose rows are `stride` floats apart (a head inside a (B,T,3C) buffer).
using StridedMap = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
using ConstStridedMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;

// The per-element math both backends share.
using math::fast_exp;
using math::fast_tanh;
using math::sigmoid;

// Below this many floats of work a kernel runs on the calling thread: a parallel region costs
// microseconds, and far more when MPI ranks oversubscribe the cores (tiny test models).
inline constexpr int64_t kMinParallelWork = int64_t{1} << 15;

using namespace checks;  // the shape checks every backend shares

}  // namespace stratagem::cpu
