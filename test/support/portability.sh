#!/usr/bin/env bash
# `make test-portability`: the numeric tests on other instruction sets and BLAS kernel paths
# (issue 41). A tolerance chosen from one machine's run fails on another CPU; the tolerances
# derived from the arithmetic (test/runtime/tolerance.py) must hold on every row below.
#   1. the project built for other instruction sets: -DSTRATAGEM_NATIVE=OFF (the compiler's
#      baseline, x86-64), -march=x86-64-v3 (AVX2, FMA) and, where the CPU has AVX-512,
#      -march=x86-64-v4; each runs the runtime and reference labels;
#   2. the default build with OpenBLAS forced onto other kernel paths that the CPU supports
#      (OPENBLAS_CORETYPE=Haswell, Sandybridge, Prescott), the same labels.
# BUILD: the default build folder (build); PORT_LABELS: the ctest labels (runtime|reference);
# PORT_ROWS: the rows to run, by name (default all: baseline x86-64-v3 x86-64-v4 Haswell
# Sandybridge Prescott); JOBS: build and ctest parallelism.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
JOBS=${JOBS:-$(nproc)}
LABELS=${PORT_LABELS:-runtime|reference}
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
has() { grep -qw "$1" <<<"$flags"; }
want() { [ -z "${PORT_ROWS:-}" ] || grep -qw -- "$1" <<<"$PORT_ROWS"; }

TARGETS=(stratagem reference_test moe_reference_test moe_ep_test cp_attention_test
         mpi_test_comm_progress)
rows=() failed=()
run_row() {  # name build-dir [VAR=value...]
  local name=$1 dir=$2; shift 2
  echo "== portability: $name"
  if (cd "$dir" && env "$@" ctest --output-on-failure -j "$JOBS" -L "$LABELS" -LE long); then
    rows+=("PASS $name")
  else
    rows+=("FAIL $name") failed+=("$name")
  fi
}
build_row() {  # name extra-cmake-args...
  local name=$1 dir=$BUILD-port-$1; shift
  cmake -S . -B "$dir" -DSTRATAGEM_NATIVE=OFF -DSTRATAGEM_CUDA=OFF "$@" >/dev/null
  # Only what the labels run: the binary, and the reference and communicator tests.
  cmake --build "$dir" -j "$JOBS" --target "${TARGETS[@]}" >/dev/null
  run_row "build $name" "$dir"
}

want baseline && build_row baseline
want x86-64-v3 && has avx2 && has fma && build_row x86-64-v3 -DCMAKE_CXX_FLAGS=-march=x86-64-v3
want x86-64-v4 && has avx512f && has avx512bw && has avx512vl &&
  build_row x86-64-v4 -DCMAKE_CXX_FLAGS=-march=x86-64-v4

cmake -S . -B "$BUILD" >/dev/null
cmake --build "$BUILD" -j "$JOBS" --target "${TARGETS[@]}" >/dev/null
for core in Haswell Sandybridge Prescott; do
  want "$core" || continue
  case $core in
    Haswell) has avx2 || continue ;;
    Sandybridge) has avx || continue ;;
    Prescott) has pni || continue ;;
  esac
  run_row "OPENBLAS_CORETYPE=$core" "$BUILD" OPENBLAS_CORETYPE=$core
done

echo "== portability summary"
printf '%s\n' "${rows[@]}"
[ ${#failed[@]} -eq 0 ] || { echo "FAIL: ${failed[*]}"; exit 1; }
echo "${#rows[@]} passed, 0 failed"
