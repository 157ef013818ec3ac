#!/usr/bin/env bash
# Plans the runtime cannot run are refused before any work: exit 2 and one line naming the
# problem (the world size with both numbers, or the unsupported feature). Nothing is written.
source "$(dirname "$0")/common.sh"
refused() {  # needle np args...
  local needle=$1 np=$2; shift 2
  set +e
  out=$(timeout 60 "${MPIRUN[@]}" -np "$np" "$BIN" train "${TINY[@]}" --data "$WORK/data.bin" \
    --steps 2 --log-json "$WORK/log.jsonl" --trace "$WORK/t.h5" "$@" 2>&1)
  rc=$?
  set -e
  [ $rc -eq 2 ] || fail "exit $rc (expected 2) for: $*; got: $out"
  grep -q -- "$needle" <<<"$out" || fail "expected '$needle' for: $*; got: $out"
  [ "$(echo "$out" | grep -c 'stratagem train')" = 1 ] || fail "not one line for: $*; got: $out"
  [ ! -e "$WORK/log.jsonl" ] && [ ! -e "$WORK/t.h5" ] || fail "work started for: $*"
  echo "ok: $needle"
}
refused "the plan needs 8 ranks .* MPI started 4" 4 --tp 2 --pp 2 --dp 2 --nodes 2
refused "the plan needs pp 1 x 2 = 2 GPUs but .* has 4" 4 --tp 2 --dp 1 --nodes 1 --global-batch 8
refused "tp 3 does not divide heads" 3 --tp 3 --dp 1
# (Sequence parallelism that differs between layers, and a last layer whose (tp, dp) differs
# from the LM head's, were refused here; parallel_equals_serial trains such plans now.)
# A plan that offloads more than the node's host memory holds: refused before any step, naming
# the pool. (The cluster file of cpu-local, with 1 MiB of host memory.)
"$BIN" simulate "${TINY[@]}" --cluster cpu-local --nodes 1 --dp 4 --global-batch 8 --micro-batch 2 \
  --dtype fp32 --trace "$WORK/c.h5" >/dev/null || fail "simulate failed"
$PY - "$WORK/c.h5" "$WORK/small-host.json" <<'PY' || fail "cannot write the cluster file"
import h5py, json, sys
c = json.loads(h5py.File(sys.argv[1], "r").attrs["cluster"])
c["node"]["host_memory_bytes"] = 1 << 20
json.dump(c, open(sys.argv[2], "w"))
PY
rm -f "$WORK/c.h5"
refused "host pool: the plan offloads .* GiB per rank .* ranks per node, more than the node's .* GiB of host memory (cluster .*node.host_memory_bytes)" \
  2 --cluster "$WORK/small-host.json" --dp 2 --zero 1 --offload optimizer,params
