#!/usr/bin/env bash
# Builds the libFuzzer targets with clang++-14 in their own folder and runs them.
#   run.sh build               configure and build ($FUZZ_BUILD, default build-fuzz)
#   run.sh run SECONDS         each target SECONDS on its committed corpus (make fuzz)
#   run.sh smoke               each target ~2 s: the committed corpus replayed, then mutated
#                              (the HDF5 targets: replayed only)
# New inputs go to $FUZZ_BUILD/corpus/<target>; crashes, hangs (over 10 s) and inputs that
# need more than 2 GB resident to $FUZZ_BUILD/artifacts/, and the run fails. The HDF5 targets
# (data_hdf5, trace_h5, checkpoint_h5) reach faults inside libhdf5 1.10.8 itself within
# minutes (known-hdf5/README.md): their campaigns run in libFuzzer's fork mode, which goes on
# past a finding, and triage.py then replays each finding and fails the run on any that is not
# inside libhdf5; the library's own faults are listed, counted by kind and function. Single mallocs up
# to 16 GB are let through: libhdf5 asks for such blocks on some damaged headers and fails
# cleanly when it cannot have them, as in a real process. A finding becomes a file
# under test/fuzz/corpus/<target>/ and a fix.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
FUZZ_BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
JOBS=${JOBS:-$(nproc)}
# FUZZ_TARGETS="a b" runs only those.
read -r -a TARGETS <<<"${FUZZ_TARGETS:-model_json cluster_json plan_json framework_json cli_args data_bin data_hdf5 trace_h5 checkpoint_h5}"
CXX14=$(command -v clang++-14 || true)
if [ -z "$CXX14" ]; then
  echo "fuzz: skipped: clang++-14 not found (Debian: apt-get install clang-14)"
  exit 77
fi

build() {
  if [ ! -f "$FUZZ_BUILD/CMakeCache.txt" ]; then
    cmake -S "$HERE" -B "$FUZZ_BUILD" -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER="$CXX14" \
      >"$FUZZ_BUILD/configure.log" 2>&1 || { cat "$FUZZ_BUILD/configure.log"; exit 1; }
  fi
  cmake --build "$FUZZ_BUILD" -j "$JOBS" >"$FUZZ_BUILD/build.log" 2>&1 ||
    { tail -50 "$FUZZ_BUILD/build.log"; exit 1; }
}

# run_target NAME SECONDS: prints "NAME: N runs in S s, corpus K inputs" or fails.
run_target() {
  local t=$1 secs=$2 log
  # The smoke starts from the committed corpus alone each time, so its length stays fixed.
  local found="$FUZZ_BUILD/corpus/$t"
  [ "$MODE" = smoke ] && found="$FUZZ_BUILD/smoke-corpus/$t" && rm -rf "$found"
  mkdir -p "$found" "$FUZZ_BUILD/artifacts"
  log="$FUZZ_BUILD/fuzz_$t.log"
  # In the smoke, the HDF5 targets only replay their corpus: mutating a valid HDF5 file reaches
  # faults inside libhdf5 1.10.8 within seconds (known-hdf5/), which would make `make test`
  # fail at random on a library bug. `make fuzz` mutates them like the others.
  local budget=(-max_total_time="$secs") hdf5=0
  case $t in data_hdf5 | trace_h5 | checkpoint_h5) hdf5=1 ;; esac
  [ "$MODE" = smoke ] && [ $hdf5 = 1 ] && budget=(-runs=0)
  if [ "$MODE" = run ] && [ $hdf5 = 1 ]; then
    budget+=(-fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1)
    rm -f "$FUZZ_BUILD/artifacts/$t-"*
  fi
  # The smoke replays committed inputs on which libhdf5 over-reads its own buffers (asan.supp);
  # the campaigns run without that suppression, so that HDF5 writing past a buffer of ours is
  # seen, and triage.py tells the library's faults from ours by who owns the memory.
  local supp=""
  [ "$MODE" = smoke ] && supp="suppressions=$HERE/asan.supp"
  local dict=()
  [ -f "$HERE/dict/$t.dict" ] && dict=(-dict="$HERE/dict/$t.dict")
  set +e
  # OpenMPI's own signal handlers would hide an abort from libFuzzer (no crash file written).
  (cd "$FUZZ_BUILD" && TMPDIR="$FUZZ_BUILD" OMPI_MCA_plm=isolated OMPI_MCA_btl=self \
    OMPI_MCA_opal_signal="" ASAN_OPTIONS="$supp${supp:+:}detect_leaks=0:allocator_may_return_null=1" \
    "./fuzz_$t" "${budget[@]}" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=16384 -print_final_stats=1 \
    -artifact_prefix="$FUZZ_BUILD/artifacts/$t-" "${dict[@]}" \
    "$found" "$HERE/corpus/$t") >"$log" 2>&1
  local rc=$?
  set -e
  local runs
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # Fork mode's parent reports "#RUNS: cov: ..." lines instead.
  [ -n "$runs" ] || runs=$(sed -n 's/^#\([0-9]*\): cov:.*/\1/p' "$log" | tail -1)
  if [ $rc -eq 0 ] && [ "$MODE" = run ] && [ $hdf5 = 1 ] &&
    compgen -G "$FUZZ_BUILD/artifacts/$t-*" >/dev/null; then
    echo "fuzz_$t: findings (replayed by triage.py; log $FUZZ_BUILD/triage_$t.log):"
    python3 "$HERE/triage.py" "$FUZZ_BUILD" "$t" "$FUZZ_BUILD/artifacts/$t-"* \
      >"$FUZZ_BUILD/triage_$t.log" 2>&1 || rc=$?
    grep -E "^summary|^ours|OURS|flaky" "$FUZZ_BUILD/triage_$t.log" | sed 's/^/  /'
    [ $rc -eq 0 ] || { echo "fuzz_$t: FAILED after ${runs:-?} runs: see the triage above"; return 1; }
  fi
  if [ $rc -ne 0 ]; then
    echo "fuzz_$t: FAILED (exit $rc) after ${runs:-?} runs; log $log:"
    grep -m1 -A25 -E "ERROR|runtime error|deadly signal|fuzz:" "$log" || tail -30 "$log"
    return 1
  fi
  echo "fuzz_$t: ${runs:-?} runs (${budget[*]}), $(ls "$found" | wc -l) new inputs," \
    "$(ls "$HERE/corpus/$t" | wc -l) committed"
}

mkdir -p "$FUZZ_BUILD"
MODE=${1:-}
case "$MODE" in
  build) build ;;
  run | smoke)
    build
    secs=${2:-600}
    [ "$1" = smoke ] && secs=2
    failed=0
    for t in "${TARGETS[@]}"; do run_target "$t" "$secs" || failed=1; done
    exit $failed
    ;;
  *)
    echo "usage: run.sh build | run SECONDS | smoke" >&2
    exit 2
    ;;
esac
