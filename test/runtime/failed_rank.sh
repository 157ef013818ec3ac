#!/usr/bin/env bash
# One failed rank of a 4-rank tp 2 x pp 2 job ends the whole job within 10 s with its message
# (issue 17 defects 1, 2, 3 and 6; issue 11's SIGKILL case):
#   - SIGKILL of one rank mid-run;
#   - SIGSTOP of one rank with --comm-timeout-s 2: the watchdog names the op, the group and
#     the ranks not arrived; once in training, once inside a checkpoint write;
#   - bad input on one rank only (a short data file, before training starts);
#   - bad input during training (the checkpoint folder replaced by a file: rank 0 only);
#   - SIGKILL of mpirun itself: no rank lives on (or writes a checkpoint), and an immediate
#     --resume succeeds.
source "$(dirname "$0")/common.sh"
PLAN=(--tp 2 --pp 2 --dp 1 --global-batch 8 --micro-batch 2)
TRAIN=(train "${TINY[@]}" "${PLAN[@]}" --steps 100000)
start() {  # name flags...: a long 4-rank run in the background; sets $job
  local name=$1; shift
  "${MPIRUN[@]}" -np 4 "$BIN" "${TRAIN[@]}" --data "$WORK/data.bin" --log-json "$WORK/$name.jsonl" \
    "$@" >"$WORK/$name.log" 2>&1 &
  job=$!
  wait_lines "$WORK/$name.jsonl" 3 "$job"
}
# finish name code needle: the job has ended (within the bound checked before) with exit code
# `code` (2: bad input; 1: a failure such as a watchdog timeout; 137: a rank killed by SIGKILL,
# as mpirun reports it) and the needle.
finish() {
  set +e; wait "$job"; rc=$?; set -e
  [ "$rc" -eq "$2" ] || fail "$1: exit $rc, expected $2; got: $(tail -20 "$WORK/$1.log")"
  grep -Eq -- "$3" "$WORK/$1.log" || fail "$1: expected '$3'; got: $(tail -20 "$WORK/$1.log")"
  echo "ok: $1 (exit $rc): $(grep -Em1 -- "$3" "$WORK/$1.log")"
}

# SIGKILL of rank 2.
start sigkill
victim=$(rank_pid "$job" 2)
[ -n "$victim" ] || fail "no rank 2 under mpirun $job"
kill -KILL "$victim"
ends_within 10 "$job" "$WORK/sigkill.log"
finish sigkill 137 "rank 2 .*(signal 9|Killed)"

# SIGSTOP of rank 1: its peers wait, the watchdog ends them after --comm-timeout-s 2.
start sigstop --comm-timeout-s 2
victim=$(rank_pid "$job" 1)
kill -STOP "$victim"
ends_within 12 "$job" "$WORK/sigstop.log"
gone_within 10 "$victim"
finish sigstop 1 "error on rank [0-3]: .* on group .* waited [0-9]+ s \(--comm-timeout-s\): not arrived: (one or more of )?ranks? [0-9]"

# SIGSTOP of rank 2 inside a checkpoint write: the others wait in a blocking collective of
# parallel HDF5 (no timeout of its own): the watchdog thread ends them.
STRATAGEM_TEST_CKPT_DELAY_S=1 start sigstop_ckpt --comm-timeout-s 2 --ckpt-dir "$WORK/ckstop" \
  --ckpt-every 4
until [ -e "$WORK/ckstop/step-00000004.h5.tmp" ]; do running "$job" || fail "ended early"; sleep 0.01; done
victim=$(rank_pid "$job" 2)
kill -STOP "$victim"
ends_within 13 "$job" "$WORK/sigstop_ckpt.log"
gone_within 10 "$victim"
finish sigstop_ckpt 1 "error on rank [0-3]: .*(closing .*step-00000004.h5.tmp|checkpoint).* waited [0-9]+ s \(--comm-timeout-s\)"

# Bad input on one rank only (defect 2): a data file too short for one sequence, on rank 3.
printf 'hi' >"$WORK/short.txt"
"$BIN" data tokenize "$WORK/short.txt" -o "$WORK/short.bin" >/dev/null
set +e
timeout -s KILL 10 "${MPIRUN[@]}" -np 3 "$BIN" "${TRAIN[@]}" --data "$WORK/data.bin" : \
  -np 1 "$BIN" "${TRAIN[@]}" --data "$WORK/short.bin" >"$WORK/short.log" 2>&1
rc=$?
set -e
[ $rc -ne 137 ] || fail "short data on one rank: the job still ran after 10 s"
[ $rc -eq 2 ] || fail "short data on one rank: exit $rc, expected 2: $(cat "$WORK/short.log")"
grep -q "error on rank 3: --data .*short.bin: 2 tokens is too small" "$WORK/short.log" ||
  fail "short data on one rank: no message: $(cat "$WORK/short.log")"
echo "ok: short data on rank 3 (exit 2): $(grep -m1 'error on rank 3' "$WORK/short.log")"

# Bad input during training (defect 1): the checkpoint folder becomes a file.
start ckdir --ckpt-dir "$WORK/ckdir" --ckpt-every 1
# (rank 0 may recreate the folder between rm and touch: repeat until a file stands there)
until [ -f "$WORK/ckdir" ]; do rm -rf "$WORK/ckdir" && touch "$WORK/ckdir"; done
ends_within 10 "$job" "$WORK/ckdir.log"
finish ckdir 2 "error on rank [0-3]: .*ckdir"

# SIGKILL of mpirun (defect 6): the ranks, in their own process groups, end with it.
start launcher --ckpt-dir "$WORK/ck" --ckpt-every 1
ranks=$(pgrep -P "$job" | tr '\n' ' ')
[ "$(echo "$ranks" | wc -w)" = 4 ] || fail "expected 4 ranks under mpirun, got: $ranks"
kill -KILL "$job"
# shellcheck disable=SC2086
gone_within 10 $ranks
wait "$job" 2>/dev/null || true
before=$(ls "$WORK/ck")
sleep 1
[ "$before" = "$(ls "$WORK/ck")" ] || fail "checkpoints changed after the job was killed"
# One step past the newest checkpoint (--resume refuses --steps below the checkpoint's).
last=$(ls "$WORK/ck" | sed -n 's/^step-0*\([0-9][0-9]*\)\.h5$/\1/p' | sort -n | tail -1)
out=$("${MPIRUN[@]}" -np 4 "$BIN" train "${TINY[@]}" "${PLAN[@]}" --data "$WORK/data.bin" \
  --steps $((last + 1)) --ckpt-dir "$WORK/ck" --resume 2>&1) ||
  fail "resume right after killing mpirun failed: $out"
grep -q "removing the lock of a job that is gone" <<<"$out" || fail "no stale-lock note: $out"
echo "ok: killed mpirun; ranks $ranks ended, nothing written afterwards, resume succeeded"
