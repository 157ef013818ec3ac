#!/usr/bin/env bash
# Run HERE (a Debian 12 build machine with the CUDA toolkit), before test/gpu/check.sh runs on
# the GPU machine, which has nvcc 13, CMake and PyTorch but no MPI, HDF5 or Boost. It fills
# gpu-deps/ (git-ignored; the device tool carries it):
#   gpu-deps/bin/   stratagem, its CUDA plugin libstratagem_cuda.so (which it loads from
#                   beside itself) and gpu_test_backends, built for sm_80/sm_90 without
#                   -march=native (the GPU machine's CPU is another one)
#   gpu-deps/root/  the Debian packages those programs and mpirun need at run time, fetched
#                   with `apt-get download` and unpacked with `dpkg -x` (no -dev packages:
#                   nothing is compiled there). CUDA's own libraries are not carried: the GPU
#                   machine has them (cuBLAS in its toolkit, NCCL in its PyTorch).
# Stays under about 60 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
DEPS=$ROOT/gpu-deps
BUILD=${GPU_BUILD:-$ROOT/build-gpu}
JOBS=${JOBS:-2}
cmake -S . -B "$BUILD" -DSTRATAGEM_NATIVE=OFF -DSTRATAGEM_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="80;90" \
  -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache >/dev/null
nice cmake --build "$BUILD" -j "$JOBS" --target stratagem stratagem_cuda gpu_test_backends
rm -rf "$DEPS" && mkdir -p "$DEPS/bin" "$DEPS/debs" "$DEPS/root"
cp "$BUILD/stratagem" "$BUILD/libstratagem_cuda.so" "$BUILD/gpu_test_backends" "$DEPS/bin/"

# The shared libraries they load, and those of mpirun and Open MPI's plugins, by package;
# glibc, the C++ runtime and CUDA's libraries stay behind (present there, in newer versions).
ompi=/usr/lib/x86_64-linux-gnu/openmpi
files=("$DEPS"/bin/* /usr/bin/orterun "$ompi"/lib/openmpi3/*.so /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix/*.so)
libs=$(ldd "${files[@]}" 2>/dev/null | awk '/=> \//{print $3}' | sort -u)
pkgs=$(for l in $libs; do
  dpkg -S "$l" 2>/dev/null || dpkg -S "/usr$l" 2>/dev/null || dpkg -S "$(readlink -f "$l")" 2>/dev/null || true
done |
  cut -d: -f1 | sort -u |
  grep -v -E '^(libc6|libstdc\+\+6|libgcc-s1|libgomp1|libzstd1|zlib1g|libssl3|libcrypt1|libudev1|libsystemd0|libcap2|libgcrypt20|libgpg-error0|liblzma5|liblz4-1|libselinux1|libpcre2-8-0)$' || true)
# mpirun itself, Open MPI's plugins and help texts, and what they need.
pkgs="$pkgs openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc-plugins"
echo "prepare: packages: $(echo $pkgs | tr '\n' ' ')"
(cd "$DEPS/debs" && apt-get download $pkgs >/dev/null)
for d in "$DEPS"/debs/*.deb; do dpkg -x "$d" "$DEPS/root"; done
rm -rf "$DEPS/debs" "$DEPS/root/usr/share/doc" "$DEPS/root/usr/share/man" "$DEPS/root/usr/share/lintian"
echo "prepare: gpu-deps/ holds $(du -sh "$DEPS" | cut -f1) ($(git rev-parse --short HEAD)$(git diff --quiet || echo ', uncommitted changes'))"
