#!/usr/bin/env bash
# SIGKILL a rank while a checkpoint is being written: the previous checkpoint still loads and
# the half-written one is ignored with a warning.
source "$(dirname "$0")/common.sh"
export STRATAGEM_TEST_CKPT_DELAY_S=2
"${MPIRUN[@]}" -np 2 "$BIN" train "${TINY[@]}" --data "$WORK/data.bin" --dp 2 --global-batch 8 \
  --micro-batch 2 --steps 1000 --ckpt-dir "$WORK/ck" --ckpt-every 3 >"$WORK/run.log" 2>&1 &
launcher=$!
wait_for() { for _ in $(seq 300); do [ -e "$1" ] && return 0; sleep 0.1; done; fail "timed out waiting for $1"; }
wait_for "$WORK/ck/step-00000003.h5"
wait_for "$WORK/ck/step-00000006.h5.tmp"
victim=$(pgrep -P "$launcher" | head -n 1)
[ -n "$victim" ] || fail "no rank process found under mpirun $launcher"
kill -9 "$victim"
wait "$launcher" && fail "training survived the killed rank" || true
[ -e "$WORK/ck/step-00000006.h5" ] && fail "a half-written checkpoint took the final name"
unset STRATAGEM_TEST_CKPT_DELAY_S
out=$("${MPIRUN[@]}" -np 2 "$BIN" train "${TINY[@]}" --data "$WORK/data.bin" --dp 2 --global-batch 8 \
  --micro-batch 2 --steps 4 --ckpt-dir "$WORK/ck" --resume 2>&1)
grep -q "ignoring half-written checkpoint .*step-00000006.h5.tmp" <<<"$out" || fail "no warning: $out"
grep -q "resumed from .*step-00000003.h5 at step 3" <<<"$out" || fail "did not resume from step 3: $out"
echo "ok: killed rank $victim mid-write; resumed from step 3 and ignored the half-written file"
