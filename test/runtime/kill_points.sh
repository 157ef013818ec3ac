#!/usr/bin/env bash
# Kill points (issue 17): a 4-rank job (pp 2 x dp 2, ZeRO-1) is killed with SIGKILL at seeded
# moments: after a checkpoint plus a random delay, or in the middle of a checkpoint write held
# open by STRATAGEM_TEST_CKPT_DELAY_S; the victim is mpirun (its ranks must end with it), one
# rank, or every process. After each kill `--resume` must continue from the newest complete
# checkpoint that verifies and reproduce the uninterrupted run's losses bit for bit.
# KILL_POINTS moments (default 20: `make test`; 100 in `make test-long`).
source "$(dirname "$0")/common.sh"
N=${KILL_POINTS:-20}
STEPS=30
RUN=("${MPIRUN[@]}" -np 4 "$BIN" train "${TINY[@]}" --data "$WORK/data.bin" --pp 2 --dp 2 --zero 1
  --global-batch 8 --micro-batch 2 --steps $STEPS --warmup 2 --ckpt-every 3)
"${RUN[@]}" --log-json "$WORK/base.jsonl" --ckpt-dir "$WORK/base" >/dev/null
base=$(losses "$WORK/base.jsonl")
[ "$(echo "$base" | wc -l)" = $STEPS ] || fail "baseline: $base"
wait_for() {  # condition pid: until the condition holds (false if the job ended first)
  for _ in $(seq 3000); do
    eval "$1" && return 0
    running "$2" || return 1
    sleep 0.01
  done
  return 1
}
lines() { [ -f "$1" ] && wc -l <"$1" || echo 0; }
during_write=0 in_steps=0 by_mpirun=0 by_rank=0 by_all=0 finished=0
for seed in $(seq 1 "$N"); do
  RANDOM=$seed
  mode=$((RANDOM % 3))
  dir=$WORK/k$seed log=$WORK/k$seed.jsonl
  if ((seed % 4 == 0)); then
    # Inside the write of checkpoint 6 (held open for 1 s) at a random point: checkpoint 3 is
    # complete and must be taken.
    target=6
    delay_ms=$((RANDOM % 900))
    trigger="$dir/step-$(printf %08d $target).h5.tmp"
    STRATAGEM_TEST_CKPT_DELAY_S=1 "${RUN[@]}" --ckpt-dir "$dir" --log-json "$log" \
      >"$WORK/k$seed.log" 2>&1 &
    job=$!
    cond="[ -e $trigger ]"
    kind=during-write
  else
    # After step 1..24 has been logged, plus up to 20 ms (a step takes a few ms): inside a
    # step or a checkpoint write.
    target=$((RANDOM % (STEPS - 6) + 1))
    delay_ms=$((RANDOM % 20))
    trigger="step $target logged"
    "${RUN[@]}" --ckpt-dir "$dir" --log-json "$log" >"$WORK/k$seed.log" 2>&1 &
    job=$!
    cond="[ \$(lines $log) -ge $target ]"
    kind=in-steps
  fi
  wait_for "$cond" "$job" || fail "seed $seed: the job ended before $trigger: $(tail "$WORK/k$seed.log")"
  sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  ranks=$(pgrep -P "$job" | tr '\n' ' ')
  if ! running "$job"; then
    finished=$((finished + 1))  # the moment fell after the end of the run
  else
    case $mode in
      0) kill -KILL "$job" 2>/dev/null || true; by_mpirun=$((by_mpirun + 1)) ;;
      1) victim=$(echo "$ranks" | tr ' ' '\n' | grep . | sed -n "$((RANDOM % 4 + 1))p" || true)
         kill -KILL "${victim:-$job}" 2>/dev/null || true; by_rank=$((by_rank + 1)) ;;
      *) # shellcheck disable=SC2086
         kill -KILL "$job" $ranks 2>/dev/null || true; by_all=$((by_all + 1)) ;;
    esac
    if [ $kind = during-write ]; then during_write=$((during_write + 1)); else in_steps=$((in_steps + 1)); fi
  fi
  ends_within 10 "$job" "$WORK/k$seed.log"
  wait "$job" 2>/dev/null || true
  # shellcheck disable=SC2086
  [ -z "$ranks" ] || gone_within 10 $ranks
  # The newest complete checkpoint (none is damaged here, so it must verify).
  newest=$(find "$dir" -name 'step-*.h5' | sort | tail -n 1)
  if [ -z "$newest" ]; then  # killed before the first checkpoint: resume has nothing to take
    out=$("${RUN[@]}" --ckpt-dir "$dir" --log-json "$log" --resume 2>&1) &&
      fail "seed $seed: resumed without a checkpoint: $out"
    grep -q "no complete checkpoint" <<<"$out" || fail "seed $seed: $out"
    out=$("${RUN[@]}" --ckpt-dir "$dir" --log-json "$log" 2>&1) || fail "seed $seed: rerun: $out"
    from="(none: ran again)"
  else
    out=$("${RUN[@]}" --ckpt-dir "$dir" --log-json "$log" --resume 2>&1) ||
      fail "seed $seed ($kind, mode $mode): resume failed: $out"
    grep -q "resumed from $newest at step" <<<"$out" ||
      fail "seed $seed: did not resume from $newest: $(echo "$out" | head -3) [...] $(echo "$out" | grep -v '^step' | tail -n +2)"
    from=$(basename "$newest")
  fi
  got=$(losses "$log")
  [ "$got" = "$base" ] || fail "seed $seed ($kind, mode $mode): losses differ:
$(paste <(echo "$base") <(echo "$got"))"
  echo "ok: seed $seed: $kind, $trigger +${delay_ms} ms, kill mode $mode, resumed from $from"
  rm -rf "$dir"
done
echo "ok: $N kill points ($in_steps during training, $during_write inside a delayed checkpoint write, $finished after the end; victims: mpirun $by_mpirun, one rank $by_rank, every process $by_all): losses bitwise equal to the uninterrupted run"
