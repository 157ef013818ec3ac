#!/usr/bin/env bash
# Limits (issue 41): checked arithmetic on GPU counts, batch sizes, products of degrees and
# simulated time; a start-up timeout on every command; memory pre-checks for train, search,
# program dump and plan check. Each case is a reproducer of the probe: a crash, a wrong time,
# a hang or an "out of memory" before, one refusal (exit 2) or a bounded exit after.
source "$(dirname "$0")/common.sh"
clusters=$(dirname "$0")/../../data/clusters
# strip_comments FILE: a cluster file as plain JSON (its // comments dropped), to edit.
strip_comments() { $PY -c '
import json, re, sys
t = "\n".join(l for l in open(sys.argv[1]) if not l.strip().startswith("//"))
print(json.dumps(json.loads(re.sub(r"\s//[^\n\"]*\n", "\n", t))))' "$1"; }

# 1. mb x dp past int's range was 0 and a divisor (SIGFPE): 2^26 ranks, 2^30 samples.
strip_comments "$clusters/dgx-a100-80g.json" |
  $PY -c 'import json,sys; c=json.load(sys.stdin); c["node"]["gpus_per_node"]=1024; print(json.dumps(c))' \
    >"$WORK/wide.json"
run "$BIN" search --model gpt2-124m --cluster "$WORK/wide.json" --nodes 65536 \
  --global-batch 1073741824 --rerank estimator
[ "$rc" = 0 ] || fail "search on 2^26 ranks: exit $rc: $(tail -3 <<<"$out")"
grep -q "megatron .*dp67108864" <<<"$out" || fail "no megatron baseline: $(tail -5 <<<"$out")"
echo "ok: search on 2^26 ranks and a batch of 2^30 (exit 0, no SIGFPE)"

# 2. An op past the fluid model's range (ns x 2^16 progress units beyond int64) took 0 s: the
# iteration came out shorter than the estimate's. Refused; one size below it, simulate and
# estimate agree.
big=(--model gpt3-175b --seq-len 128 --cluster cpu-local --nodes 1 --gpus-per-node 1 --dp 1)
expect_rc 2 "takes 2.03e+05 s, beyond the simulator's range of one op, 2^47 ns (140737 s)" \
  "$BIN" simulate "${big[@]}" --micro-batch 16384 --global-batch 16384
grep -q "op 'L[0-9]*.mlp.bwd.compute mb0' (compute)" <<<"$out" || fail "the op is not named: $out"
sim=$("$BIN" simulate "${big[@]}" --micro-batch 8192 --global-batch 8192 --json 2>/dev/null |
  $PY -c 'import json,sys; print(json.load(sys.stdin)["iteration_time_s"])')
est=$("$BIN" estimate "${big[@]}" --micro-batch 8192 --global-batch 8192 --json 2>/dev/null |
  $PY -c 'import json,sys; print(json.load(sys.stdin)["iteration_time_s"])')
$PY -c "import sys; s, e = $sim, $est; sys.exit(abs(s - e) > 0.01 * e)" ||
  fail "micro-batch 8192: simulate $sim s, estimate $est s"
echo "ok: an op past 2^47 ns is refused; below it simulate ($sim s) and estimate agree"

# 3. The clock saturated at 2^63 ns: on the slowest legal GPU two batches gave the same time.
strip_comments "$clusters/cpu-local.json" | $PY -c '
import json, sys
c = json.load(sys.stdin)
c["gpu"]["peak_flops"] = {k: 1e6 for k in c["gpu"]["peak_flops"]}
c["gpu"]["hbm_bandwidth_gbps"] = 1e-3
print(json.dumps(c))' >"$WORK/slow.json"
slow=(--model gpt2-124m --seq-len 256 --cluster "$WORK/slow.json" --nodes 1 --gpus-per-node 1 --dp 1)
"$BIN" simulate "${slow[@]}" --global-batch 1024 >/dev/null 2>&1 || fail "1024 samples refused"
for gb in 24576 98304; do
  expect_rc 2 "the simulated clock passes the simulator's range, 2^61 ns (2.31e+09 s)" \
    "$BIN" simulate "${slow[@]}" --global-batch "$gb"
done

# 4. A rank stopped before MPI_Init: every command takes --comm-timeout-s, and the job ends
# within it (plus the launcher's teardown), naming the rank. Rank 1 stays stopped: the trap
# kills whatever of the job is left.
stopped_jobs=()
cleanup_stopped() {
  local p
  for p in "${stopped_jobs[@]}"; do
    pkill -CONT -P "$p" 2>/dev/null || true
    pkill -KILL -P "$p" 2>/dev/null || true
    kill -KILL "$p" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup_stopped EXIT
# start_stopped LOG BOUND ARGS...: stratagem ARGS on 2 ranks, rank 1 stopped before it starts;
# the job must end within BOUND seconds with the start-up's line.
start_stopped() {
  local log=$1 bound=$2; shift 2
  "${MPIRUN[@]}" -np 2 bash -c '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && kill -STOP $$; exec "$@"' x \
    "$BIN" "$@" >"$log" 2>&1 &
  local job=$!
  stopped_jobs+=("$job")
  ends_within "$bound" "$job" "$log"
  set +e; wait "$job"; rc=$?; set -e
  [ "$rc" != 0 ] || fail "a rank stopped in start-up: exit 0 for $*"
  grep -qF "error on rank 0: MPI start-up (MPI_Init and the first collective) waited" "$log" &&
    grep -qF "(--comm-timeout-s): not arrived: rank 1 (stopped or died)" "$log" ||
    fail "$*: $(head -3 "$log")"
}
est=(estimate --model gpt2-124m --cluster dgx-a100-80g --nodes 1 --dp 8 --global-batch 8)
start_stopped "$WORK/est.log" 30 "${est[@]}" --comm-timeout-s 5
grep -qF "waited 5 s" "$WORK/est.log" || fail "$(head -2 "$WORK/est.log")"
echo "ok: estimate with rank 1 stopped ends after --comm-timeout-s 5, naming rank 1"
# Without the flag: the start-up's default (60 s), well under the old 600.
start_stopped "$WORK/default.log" 120 "${est[@]}"
echo "ok: without --comm-timeout-s the start-up waits its 60 s default"
# Every MPI verb takes the flag (each refused it but train's); a bad value is one line.
"$BIN" "${est[@]}" --comm-timeout-s 5 >/dev/null || fail "estimate refused --comm-timeout-s"
"$BIN" simulate --model gpt2-124m --nodes 1 --tp 2 --pp 4 --global-batch 8 --comm-timeout-s 5 \
  >/dev/null || fail "simulate refused --comm-timeout-s"
"$BIN" search --model gpt2-124m --nodes 1 --global-batch 8 --rerank estimator \
  --comm-timeout-s 5 >/dev/null 2>&1 || fail "search refused --comm-timeout-s"
"$BIN" plan check --model gpt2-124m --nodes 1 --dp 8 --global-batch 8 --comm-timeout-s 5 \
  >/dev/null || fail "plan check refused --comm-timeout-s"
"$BIN" model show --model gpt2-124m --comm-timeout-s 5 >/dev/null ||
  fail "model show refused --comm-timeout-s"
"$BIN" profile --help | grep -F -- "--comm-timeout-s" >/dev/null || fail "profile --help: no --comm-timeout-s"
expect_rc 2 "--comm-timeout-s" "$BIN" "${est[@]}" --comm-timeout-s 0
echo "ok: every verb takes --comm-timeout-s"

# 5. Memory pre-checks (under ulimit -v, as memory.sh, which says why AddressSanitizer skips):
# each of these ended in exit 1 "out of memory".
if ldd "$BIN" 2>/dev/null | grep libasan >/dev/null; then
  echo "ok (memory pre-checks skipped: $BIN is built with AddressSanitizer)"
  exit 0
fi
(
  ulimit -v 4000000
  expect_rc 2 "the Program of 1073741824 micro-batches (--global-batch 1073741824" \
    "$BIN" train "${TINY[@]}" --data "$WORK/data.bin" --steps 1 --global-batch 1073741824
  expect_rc 2 "the stage DP (--layers 100000 x" \
    "$BIN" search --model gpt2-124m --layers 100000 --nodes 1 --global-batch 8 --rerank estimator
  expect_rc 2 "the Program of 134217728 micro-batches (--global-batch 1073741824" \
    "$BIN" program dump --model gpt2-124m --nodes 1 --global-batch 1073741824
  expect_rc 2 "the layout of 1000000512 ranks (--nodes 976563 x --gpus-per-node 1024) needs about" \
    "$BIN" plan check --model gpt2-124m --cluster "$WORK/wide.json" --nodes 976563 \
    --global-batch 1000000512
)
echo ok
