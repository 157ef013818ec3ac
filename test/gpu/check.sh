#!/usr/bin/env bash
# The GPU check of issue 13, in one go on the GPU machine (about 8 minutes on one H200):
#   1. gpu_test_backends: every Backend op, forward and backward, cuda (fp32 and bf16)
#      against the cpu backend;
#   2. train_matches_cpu.sh: training losses on cuda against cpu, and tp 2 x pp 2 on one GPU
#      (--comm mpi) against 1 rank, and NCCL on one rank;
#   3. bench_gpu.sh (`make bench-gpu`): tokens/s and MFU of gpt2-124m/350m/1.5b beside the
#      simulator's forecast.
# It uses the build and the run-time packages test/gpu/prepare.sh put in gpu-deps/ (the
# machine has no MPI, HDF5 or Boost); carry gpu-deps with the device tool. Logs go to $OUT
# (or ./gpu-check-out) as check.log, backends.log, train.log and bench.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
DEPS=$ROOT/gpu-deps
OUTDIR=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/check.log") 2>&1
[ -x "$DEPS/bin/stratagem" ] || { echo "check: run test/gpu/prepare.sh first (no gpu-deps/)"; exit 2; }
R=$DEPS/root
# Only the libraries the machine lacks (by soname) come from gpu-deps, through links in one
# folder: the machine's own versions win.
rm -rf "$DEPS/lib" && mkdir -p "$DEPS/lib"
for f in "$R"/usr/lib/x86_64-linux-gnu/*.so.* "$R"/lib/x86_64-linux-gnu/*.so.*; do
  [ -e "$f" ] || continue
  ldconfig -p | grep "^[[:space:]]*$(basename "$f") " >/dev/null || ln -sf "$f" "$DEPS/lib/"
done
# cuBLAS from the toolkit; NCCL from the toolkit, else from PyTorch's nvidia-nccl wheel.
cudalib=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublasLt.so.13" ] && cudalib="$cudalib:$d"
done
# What the toolkit lacks comes from PyTorch's nvidia-* wheels (NCCL at least).
wheel_lib() {
  python3 -c "import nvidia.$1 as m; print(list(m.__path__)[0] + '/lib')" 2>/dev/null || true
}
[ -n "$cudalib" ] || cudalib=":$(wheel_lib cublas):$(wheel_lib cuda_runtime)"
ls /usr/local/cuda/lib*/libnccl.so.2 >/dev/null 2>&1 || cudalib="$cudalib:$(wheel_lib nccl)"
export LD_LIBRARY_PATH="$DEPS/lib:$R/usr/lib/x86_64-linux-gnu/openmpi/lib$cudalib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Open MPI and PMIx from their unpacked location; shared memory without CMA (containers).
export OPAL_PREFIX=$R/usr
export PMIX_MCA_mca_base_component_path=$R/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
export HWLOC_PLUGINS_PATH=$R/usr/lib/x86_64-linux-gnu/hwloc
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
mkdir -p "$DEPS/path" && ln -sf "$R/usr/bin/orterun" "$DEPS/path/mpirun"
export PATH=$DEPS/path:$R/usr/bin:$PATH
export STRATAGEM_BIN=$DEPS/bin/stratagem STRATAGEM_DATA=$ROOT/data
export PY=$(command -v python3)
echo "check: $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
echo "check: stratagem $("$STRATAGEM_BIN" --version 2>/dev/null | head -1), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
# The binary loads its CUDA plugin from beside itself (gpu-deps/bin/libstratagem_cuda.so);
# its second --version line names the plugin, its CUDA runtime and NCCL, and the devices, or
# what is missing.
echo "check: $("$STRATAGEM_BIN" --version 2>&1 | tail -1)"
missing=$(ldd "$DEPS/bin/stratagem" "$DEPS/bin/libstratagem_cuda.so" "$DEPS/bin/gpu_test_backends" |
  grep "not found" | sort -u)
[ -z "$missing" ] || echo "check: libraries not found: $missing"
status=0
step() {  # name timeout_s command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "=== $name"
  timeout "$limit" "$@" >"$OUTDIR/$name.log" 2>&1
  local rc=$?
  tail -40 "$OUTDIR/$name.log"
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || status=1
}
step backends 120 "$DEPS/bin/gpu_test_backends" --log_level=test_suite
step train 240 bash test/gpu/train_matches_cpu.sh
step bench 240 bash test/gpu/bench_gpu.sh
echo "check: done, exit $status"
exit $status
