#!/usr/bin/env bash
# Signals (issue 30, item 5): a first SIGTERM in the loop checkpoints at the step boundary; a
# process not yet in the loop, one still short of the boundary after --signal-grace-s, or one
# given a second SIGTERM exits at once; a rank stopped during MPI start-up ends the job after
# --comm-timeout-s, and a rank missing the step boundary's agreement is named. Runs wait for
# markers (a log line, a step held by STRATAGEM_TEST_HOLD_STEP), never for time to pass; the
# bounds below only catch a hang.
source "$(dirname "$0")/common.sh"
D=(--data "$WORK/data.bin")
# wait_for_line FILE TEXT PID: until FILE holds TEXT (while PID runs).
wait_for_line() {
  until grep -qF -- "$2" "$1" 2>/dev/null; do
    running "$3" || fail "ended before '$2': $(cat "$1")"
    sleep 0.05
  done
}
# start_held N ARGS...: two ranks, rank 1 held after step 1 (until $WORK/release, if it is
# made), logging to $WORK/N.log and $WORK/N.jsonl; once step 1 is logged, sets $job and $r0
# (mpirun's and rank 0's pids).
start_held() {
  local n=$1; shift
  STRATAGEM_TEST_HOLD_STEP=1:1 STRATAGEM_TEST_HOLD_RELEASE="$WORK/release" "${MPIRUN[@]}" -np 2 \
    "${TRAIN[@]}" "${D[@]}" --dp 2 --steps 10 --log-json "$WORK/$n.jsonl" "$@" >"$WORK/$n.log" 2>&1 &
  job=$!
  wait_for_line "$WORK/$n.jsonl" '"step": 1,' "$job"
  r0=$(rank_pid "$job" 0)
}
# finish PID LOG: waits (bounded) for PID and sets $rc and $out.
finish() {
  ends_within 60 "$1" "$2"
  set +e; wait "$1"; rc=$?; set -e
  out=$(cat "$2")
}

# 1. Before the loop: held there by the test hook (a FIFO given as --model blocked its open
# once; inputs must now be regular files, and a FIFO is refused before it is opened).
STRATAGEM_TEST_HOLD_STEP=0 "${TRAIN[@]}" "${D[@]}" --steps 1 >"$WORK/1.log" 2>&1 &
pid=$!
wait_for_line "$WORK/1.log" "held before the training loop" "$pid"
kill -TERM "$pid"
finish "$pid" "$WORK/1.log"
[ "$rc" = 143 ] || fail "before the loop: exit $rc, not 143: $out"
grep -qF "stratagem train: SIGTERM before the training loop (nothing to checkpoint yet): exiting without a checkpoint" <<<"$out" || fail "$out"
echo "ok: SIGTERM before the loop exits at once (143)"

# 2. In the loop: held after step 2 until the signal; checkpoint and exit 0.
STRATAGEM_TEST_HOLD_STEP=2 "${TRAIN[@]}" "${D[@]}" --steps 10 --ckpt-dir "$WORK/ck2" \
  --log-json "$WORK/2.jsonl" >"$WORK/2.log" 2>&1 &
pid=$!
wait_for_line "$WORK/2.jsonl" '"step": 2,' "$pid"
kill -TERM "$pid"
finish "$pid" "$WORK/2.log"
[ "$rc" = 0 ] || fail "SIGTERM in the loop: exit $rc: $out"
grep -qF "signal 15: checkpointed at step 2, exiting to be resumed" <<<"$out" || fail "$out"
[ -f "$WORK/ck2/step-00000002.h5" ] || fail "no checkpoint at step 2: $(ls "$WORK/ck2")"
echo "ok: SIGTERM in the loop checkpoints at the step boundary (exit 0)"

# 3. Two ranks, rank 1 held past step 1 with no signal of its own: rank 0, signalled, never
# reaches the boundary and leaves after the grace; the job ends.
start_held 3 --signal-grace-s 2
kill -TERM "$r0"
finish "$job" "$WORK/3.log"
[ "$rc" != 0 ] || fail "past the grace: exit 0"
grep -qF "stratagem train: on rank 0: no step boundary within --signal-grace-s 2 s of SIGTERM: exiting without a checkpoint" <<<"$out" || fail "$out"
echo "ok: no step boundary within the grace: the rank exits, the job ends (exit $rc)"

# 4. The same, with the default grace (120 s) and a second SIGTERM once the first has arrived.
start_held 4
kill -TERM "$r0"
wait_for_line "$WORK/4.log" "on rank 0: SIGTERM: checkpoint at the next step boundary" "$job"
kill -TERM "$r0"
finish "$job" "$WORK/4.log"
[ "$rc" != 0 ] || fail "a second SIGTERM: exit 0"
grep -qF "stratagem train: on rank 0: a second SIGTERM: exiting without a checkpoint" <<<"$out" || fail "$out"
echo "ok: a second SIGTERM exits at once (exit $rc)"

# 5. SIGUSR1, SIGUSR1 again and then SIGTERM are one request (Slurm's TERM and the job script's
# USR1 for one scancel come in either order): rank 1 is held until the test releases it, then
# both checkpoint at the boundary and exit 0.
start_held 5 --ckpt-dir "$WORK/ck5"
kill -USR1 "$r0"
wait_for_line "$WORK/5.log" "on rank 0: SIGUSR1: checkpoint at the next step boundary" "$job"
kill -USR1 "$r0"
kill -TERM "$r0"
touch "$WORK/release"
finish "$job" "$WORK/5.log"
# Rank 0 may have entered step 1's agreement before the signal: the stop is at step 1 or 2.
[ "$rc" = 0 ] && grep -q "signal 10: checkpointed at step [12]," <<<"$out" &&
  compgen -G "$WORK/ck5/step-0000000[12].h5" >/dev/null || fail "USR1, USR1, TERM: exit $rc: $out"
! grep -q "exiting without a checkpoint" <<<"$out" || fail "$out"
echo "ok: SIGUSR1 twice then SIGTERM: one checkpoint, exit 0"

# 6. A rank stopped before it enters MPI: the other leaves MPI's start-up after
# --comm-timeout-s, naming it.
"${MPIRUN[@]}" -np 2 bash -c '[ "$OMPI_COMM_WORLD_RANK" = 1 ] && kill -STOP $$; exec "$@"' rank \
  "${TRAIN[@]}" "${D[@]}" --dp 2 --steps 1 --comm-timeout-s 3 >"$WORK/6.log" 2>&1 &
job=$!
finish "$job" "$WORK/6.log"
[ "$rc" != 0 ] || fail "a rank stopped in start-up: exit 0"
grep -qF "stratagem train: error on rank 0: MPI start-up (MPI_Init and the first collective) waited 3 s (--comm-timeout-s)" <<<"$out" || fail "$out"
echo "ok: a rank stopped during MPI start-up ends the job after --comm-timeout-s"

# 7. A rank that never reaches the step boundary's agreement (held, no signal): rank 0 names it,
# not "one or more of" every other rank.
STRATAGEM_TEST_HOLD_STEP=1:2 "${MPIRUN[@]}" -np 4 "${TRAIN[@]}" "${D[@]}" --dp 4 --steps 3 \
  --comm-timeout-s 3 >"$WORK/7.log" 2>&1 &
job=$!
finish "$job" "$WORK/7.log"
[ "$rc" != 0 ] || fail "a rank missing the agreement: exit 0"
grep -qF "stratagem train: error on rank 0: all-reduce of stop signals (world) waited 3 s (--comm-timeout-s): not arrived: rank 2 (stopped or died)" <<<"$out" || fail "$out"
echo "ok: the agreement's timeout names the late rank"
echo ok
