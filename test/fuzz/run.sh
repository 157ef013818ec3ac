#!/usr/bin/env bash
# Builds the libFuzzer targets with clang++-14 in their own folder and runs them.
#   run.sh build               configure and build ($FUZZ_BUILD, default build-fuzz)
#   run.sh run SECONDS         each target SECONDS on its committed corpus (make fuzz)
#   run.sh smoke               each target ~2 s: the committed corpus replayed, then mutated
#                              (the HDF5 targets: replayed only)
# New inputs go to $FUZZ_BUILD/corpus/<target>; crashes, hangs (over 10 s) and inputs that
# need more than 2 GB resident to $FUZZ_BUILD/artifacts/, and the run fails. A finding becomes a
# file under test/fuzz/corpus/<target>/ and a fix.
# libhdf5 1.10.8 itself crashes and hangs on some damaged files (known-hdf5/README.md):
#  - data_hdf5 and trace_h5 read files stratagem did not verify (token files, traces without a
#    digest), which the product reads in a child process (stratagem/hdf5_guard.hpp): a libhdf5 crash
#    or hang there is the product's bad-input error, so data_hdf5 runs like the others. The bound on
#    the child is 8 s (STRATAGEM_HDF5_TIMEOUT_S), under libFuzzer's 10 s; harness.cpp aborts
#    (a finding) when the child's fault is ours. Single mallocs over 16 GB get NULL
#    (max_allocation_size_mb), as a real process does, rather than libFuzzer's malloc limit,
#    which would write a crash file from inside the child.
#  - checkpoint_h5, and trace_h5's resealed second read, reach libhdf5 in the process (a file
#    with a digest is verified before libhdf5 opens it; the targets reseal damaged inputs to fuzz
#    the parsing behind that check; a libhdf5 state damaged there was seen to make a later child
#    read freed memory): their campaigns run in libFuzzer's fork mode, which goes on past a
#    finding, and triage.py then replays each finding and fails the run on any that is not inside
#    libhdf5. checkpoint_h5 lets single mallocs up to 16 GB through: libhdf5 asks for such blocks
#    on some damaged headers.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
FUZZ_BUILD=${FUZZ_BUILD:-$ROOT/build-fuzz}
JOBS=${JOBS:-$(nproc)}
# FUZZ_TARGETS="a b" runs only those.
read -r -a TARGETS <<<"${FUZZ_TARGETS:-model_json cluster_json plan_json framework_json cli_args data_bin data_hdf5 trace_h5 checkpoint_h5 hf_config megatron_args}"
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
  local budget=(-max_total_time="$secs") hdf5=0 forks=0 malloc_limit=16384 asan_more=""
  case $t in data_hdf5 | trace_h5 | checkpoint_h5) hdf5=1 ;; esac
  case $t in trace_h5 | checkpoint_h5) forks=1 ;; esac
  case $t in data_hdf5 | trace_h5) malloc_limit=32768 asan_more=":max_allocation_size_mb=16384" ;; esac
  [ "$MODE" = smoke ] && [ $hdf5 = 1 ] && budget=(-runs=0)
  if [ "$MODE" = run ] && [ $forks = 1 ]; then
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
    OMPI_MCA_opal_signal="" STRATAGEM_HDF5_TIMEOUT_S=8 \
    ASAN_OPTIONS="$supp${supp:+:}detect_leaks=0:allocator_may_return_null=1$asan_more" \
    "./fuzz_$t" "${budget[@]}" -timeout=10 -detect_leaks=0 -rss_limit_mb=2048 -malloc_limit_mb=$malloc_limit -print_final_stats=1 \
    -artifact_prefix="$FUZZ_BUILD/artifacts/$t-" "${dict[@]}" \
    "$found" "$HERE/corpus/$t") >"$log" 2>&1
  local rc=$?
  set -e
  local runs
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  # Fork mode's parent reports "#RUNS: cov: ..." lines instead.
  [ -n "$runs" ] || runs=$(sed -n 's/^#\([0-9]*\): cov:.*/\1/p' "$log" | tail -1)
  # Fork mode's parent exits 1 when its jobs found anything, even with -ignore_crashes, after
  # the whole campaign ("fuzzed for N seconds"): the triage decides then.
  if [ $rc -eq 1 ] && [ $forks = 1 ] && grep -q "^INFO: fuzzed for" "$log"; then rc=0; fi
  if [ $rc -eq 0 ] && [ "$MODE" = run ] && [ $forks = 1 ] &&
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
