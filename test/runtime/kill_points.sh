#!/usr/bin/env bash
# Kill points (issue 17): a 4-rank job (pp 2 x dp 2, ZeRO-1) is killed with SIGKILL at seeded
# moments: after a checkpoint plus a random delay, or in the middle of a checkpoint write held
# open by STRATAGEM_TEST_CKPT_DELAY_S; the victim is mpirun (its ranks must end with it), one
# rank, or every process. After each kill `--resume` must continue from the newest complete
# checkpoint that verifies and reproduce the uninterrupted run's losses bit for bit.
# KILL_POINTS moments (default 20: `make test`; 100 in `make test-long`).
source "$(dirname "$0")/common.sh"
N=${KILL_POINTS:-20}
STEPS=10
RUN=("${MPIRUN[@]}" -np 4 "$BIN" train "${TINY[@]}" --data "$WORK/data.bin" --pp 2 --dp 2 --zero 1
  --global-batch 8 --micro-batch 2 --steps $STEPS --warmup 2)
"${RUN[@]}" --log-json "$WORK/base.jsonl" >/dev/null
base=$(losses "$WORK/base.jsonl")
[ "$(echo "$base" | wc -l)" = $STEPS ] || fail "baseline: $base"
wait_file() {  # file pid: until it exists (false if the job ended first)
  for _ in $(seq 2000); do
    [ -e "$1" ] && return 0
    running "$2" || return 1
    sleep 0.01
  done
  return 1
}
during_write=0 after_ckpt=0 by_mpirun=0 by_rank=0 by_all=0 finished=0
for seed in $(seq 1 "$N"); do
  RANDOM=$seed
  target=$(((RANDOM % 3 + 1) * 2))  # checkpoint 2, 4 or 6
  mode=$((RANDOM % 3))
  delay_ms=$((RANDOM % 200))
  dir=$WORK/k$seed log=$WORK/k$seed.jsonl
  if ((seed % 4 == 0)); then  # kill while the write of checkpoint `target` is held open
    target=$((target > 4 ? 4 : target))
    STRATAGEM_TEST_CKPT_DELAY_S=1 "${RUN[@]}" --ckpt-dir "$dir" --ckpt-every 2 --log-json "$log" \
      >"$WORK/k$seed.log" 2>&1 &
    job=$!
    trigger="$dir/step-$(printf %08d $target).h5.tmp"
    delay_ms=$((delay_ms * 4))
    kind=during-write
  else
    "${RUN[@]}" --ckpt-dir "$dir" --ckpt-every 2 --log-json "$log" >"$WORK/k$seed.log" 2>&1 &
    job=$!
    trigger="$dir/step-$(printf %08d $target).h5"
    kind=after-checkpoint
  fi
  wait_file "$trigger" "$job" || fail "seed $seed: the job ended before $trigger: $(tail "$WORK/k$seed.log")"
  sleep "$(printf '0.%03d' $delay_ms)"
  ranks=$(pgrep -P "$job" | tr '\n' ' ')
  if ! running "$job"; then
    finished=$((finished + 1))  # the moment fell after the end of the run
  else
    case $mode in
      0) kill -KILL "$job"; by_mpirun=$((by_mpirun + 1)) ;;
      1) victim=$(echo "$ranks" | tr ' ' '\n' | grep . | sed -n "$((RANDOM % 4 + 1))p")
         kill -KILL "${victim:-$job}"; by_rank=$((by_rank + 1)) ;;
      2) # shellcheck disable=SC2086
         kill -KILL "$job" $ranks; by_all=$((by_all + 1)) ;;
    esac
    [ $kind = during-write ] && during_write=$((during_write + 1)) || after_ckpt=$((after_ckpt + 1))
  fi
  ends_within 10 "$job"
  wait "$job" 2>/dev/null || true
  # shellcheck disable=SC2086
  [ -z "$ranks" ] || gone_within 10 $ranks
  # The newest complete checkpoint (none is damaged here, so it must verify).
  newest=$(find "$dir" -name 'step-*.h5' | sort | tail -n 1)
  [ -n "$newest" ] || fail "seed $seed: no complete checkpoint after $trigger"
  out=$("${RUN[@]}" --ckpt-dir "$dir" --ckpt-every 2 --log-json "$log" --resume 2>&1) ||
    fail "seed $seed ($kind, mode $mode): resume failed: $out"
  echo "$out" | grep -q "resumed from $newest at step" ||
    fail "seed $seed: did not resume from $newest: $(echo "$out" | grep -v '^step')"
  got=$(losses "$log")
  [ "$got" = "$base" ] || fail "seed $seed ($kind, mode $mode): losses differ:
$(paste <(echo "$base") <(echo "$got"))"
  echo "ok: seed $seed: $kind $trigger +${delay_ms} ms, kill mode $mode, resumed from $(basename "$newest")"
  rm -rf "$dir"
done
echo "ok: $N kill points ($after_ckpt after a checkpoint, $during_write during a write, $finished after the end; victims: mpirun $by_mpirun, one rank $by_rank, all $by_all): losses bitwise equal"
