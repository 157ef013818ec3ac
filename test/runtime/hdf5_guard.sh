#!/usr/bin/env bash
# No damaged HDF5 file hangs a command (issue 17). libhdf5 1.10.8 loops forever on a global heap
# whose free space claims 0 bytes (test/fuzz/known-hdf5/*-hang-in-H5HG_read: a trace's string
# attribute, a token file's virtual-dataset mapping). A trace written without a digest and a
# --data token file reach libhdf5 unverified, so libhdf5 reads them in a child process only
# (stratagem/hdf5_guard.hpp): past STRATAGEM_HDF5_TIMEOUT_S, or when libhdf5 crashes there, the
# command prints one line naming the file and exits 2; in an MPI job that ends every rank. Every run here is under `timeout`, so
# this test cannot hang.
source "$(dirname "$0")/common.sh"
KNOWN=$(cd "$(dirname "$0")/../fuzz/known-hdf5" && pwd)
TRACE=$KNOWN/trace-hang-in-H5HG_read
DATA=$KNOWN/data-hang-in-H5HG_read
export STRATAGEM_HDF5_TIMEOUT_S=2
LIMIT=60  # far above the bound: a run still going then hangs

# run_bounded CMD...: out (stdout and stderr), rc; fails on a run still going after LIMIT s.
run_bounded() {
  set +e
  out=$(timeout -k 5 "$LIMIT" "$@" 2>&1)
  rc=$?
  set -e
  [ $rc -ne 124 ] && [ $rc -ne 137 ] || fail "still running after $LIMIT s: $*"
}
# guarded WHO FILE CMD...: exit 2 and exactly the guard's line, nothing else (no HDF5 output).
guarded() {
  local who=$1 file=$2; shift 2
  run_bounded "$@"
  [ $rc -eq 2 ] || fail "exit $rc, not 2, for: $*; got: $out"
  local want="$who: error: $file: libhdf5 did not finish reading it within 2 s; the file is damaged"
  [ "$out" = "$want" ] || fail "for: $*
expected exactly: $want
got: $out"
}

# The trace's string attributes: export, compare and report read them.
guarded "stratagem trace export" "$TRACE" "$BIN" trace export "$TRACE" --chrome "$WORK/t.json"
[ ! -e "$WORK/t.json" ] || fail "trace export left $WORK/t.json"
guarded "stratagem compare" "$TRACE" "$BIN" compare "$TRACE" "$TRACE"
guarded "stratagem report" "$TRACE" "$BIN" report --trace "$TRACE" -o "$WORK/r.html"
# trace info stops earlier, at its damaged /ranks: exit 2 as well, one line naming the file.
run_bounded "$BIN" trace info "$TRACE"
[ $rc -eq 2 ] || fail "trace info: exit $rc, not 2; got: $out"
[ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "$TRACE" <<<"$out" || fail "trace info: $out"

# A token file: alone, and as one rank's data in a 2-rank job (the job ends, each rank says so).
guarded "stratagem train" "$DATA" "$BIN" train "${TINY[@]}" --data "$DATA" --steps 1
run_bounded "${MPIRUN[@]}" -np 2 "$BIN" train "${TINY[@]}" --dp 2 --global-batch 4 \
  --data "$DATA" --steps 1
[ $rc -ne 0 ] || fail "2 ranks: exit 0 on $DATA"
grep -Eq "^stratagem train: error( on rank [01])?: $DATA: libhdf5 did not finish reading it within 2 s; the file is damaged$" <<<"$out" ||
  fail "2 ranks: no guard line; got: $out"
! grep -qi "hdf5-diag\|infinite loop" <<<"$out" || fail "HDF5's own diagnostics leaked: $out"
# libhdf5 crashing inside the library (SIGFPE, SIGSEGV) on a token file: the read runs in a child
# process, so the command says so in one line and exits 2, alone and in a 2-rank job (Open MPI
# after MPI_Init tolerates the fork).
for sig_file in SIGFPE:data-divide-by-zero-in-H5D__chunk_set_info \
  SIGSEGV:data-null-read-in-H5F__accum_read; do
  sig=${sig_file%%:*} crash=$KNOWN/${sig_file#*:}
  want="$crash: libhdf5 crashed reading it ($sig); the file is damaged"
  run_bounded "$BIN" train "${TINY[@]}" --data "$crash" --steps 1
  [ $rc -eq 2 ] && [ "$out" = "stratagem train: error: $want" ] ||
    fail "train --data $crash: exit $rc, expected 2 and: stratagem train: error: $want
got: $out"
  run_bounded "${MPIRUN[@]}" -np 2 "$BIN" train "${TINY[@]}" --dp 2 --global-batch 4 \
    --data "$crash" --steps 1
  [ $rc -ne 0 ] || fail "2 ranks: exit 0 on $crash"
  grep -Fxq -e "stratagem train: error: $want" -e "stratagem train: error on rank 0: $want" \
    -e "stratagem train: error on rank 1: $want" <<<"$out" ||
    fail "2 ranks: no crash line for $crash; got: $out"
done
# A good token file (h5py, no digest) trains under the same guard.
$PY - "$WORK/data.bin" "$WORK/data.h5" <<'PY'
import sys, numpy as np, h5py
tok = np.fromfile(sys.argv[1], dtype=np.uint16, offset=1024)
with h5py.File(sys.argv[2], "w") as f:
    f["tokens"] = tok.astype(np.int32)
PY
run_bounded "$BIN" train "${TINY[@]}" --data "$WORK/data.h5" --steps 1 --global-batch 4
[ $rc -eq 0 ] || fail "a good HDF5 token file: exit $rc; got: $out"
run_bounded "${MPIRUN[@]}" -np 2 "$BIN" train "${TINY[@]}" --dp 2 --global-batch 4 \
  --data "$WORK/data.h5" --steps 1
[ $rc -eq 0 ] || fail "a good HDF5 token file, 2 ranks: exit $rc; got: $out"
# A good trace without a digest (its user block removed, as traces written before digests): read
# in child processes, it reads as the same trace with a digest read in the process.
"$BIN" simulate "${TINY[@]}" --cluster cpu-local --nodes 1 --dp 4 --global-batch 4 \
  --trace "$WORK/t.h5" >/dev/null || fail "simulate --trace"
h5unjam -i "$WORK/t.h5" -o "$WORK/plain.h5" >/dev/null || fail "h5unjam"
[ "$(head -c 4 "$WORK/plain.h5" | tail -c 3)" = HDF ] || fail "h5unjam left a user block"
for f in t plain; do
  run_bounded "$BIN" trace export "$WORK/$f.h5" --chrome "$WORK/$f.json"
  [ $rc -eq 0 ] || fail "trace export $f.h5: exit $rc: $out"
  run_bounded "$BIN" trace info "$WORK/$f.h5"
  [ $rc -eq 0 ] || fail "trace info $f.h5: exit $rc: $out"
  sed "s|$WORK/$f.h5|FILE|" <<<"$out" >"$WORK/$f.info"
done
cmp -s "$WORK/t.json" "$WORK/plain.json" || fail "a trace without a digest exports otherwise"
cmp -s "$WORK/t.info" "$WORK/plain.info" || fail "trace info differs without a digest"
echo "ok: trace export/compare/report and train --data on libhdf5-hang files exit 2 within $LIMIT s with the guard's line; libhdf5 crashes on token files exit 2 with one line"
