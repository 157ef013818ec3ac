#!/usr/bin/env bash
# Mixture-of-Experts layouts train equal to the serial run (issue #26's acceptance model: a
# LLaMA-style tiny MoE, 4 experts, top-2): expert parallelism over the data-parallel ranks
# (the all-to-all dispatch and combine), ep inside dp with the experts' gradients reduced over
# the expert data-parallel group, ZeRO-1/2 beside it (the plan refuses ZeRO-3 of expert-parallel
# layers), and a pipeline. Losses over 5 steps within 1e-5 relative, final weights within 1e-5
# (checkpoints hold each expert whole), each memory category within 10% of the forecast (the
# buffers printed only, below); and a checkpoint of ep 2 resumes under ep 1.
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/serial_twin.sh"
MOE=(--layers 2 --hidden 64 --heads 4 --vocab 256 --seq-len 32 --experts 4 --top-k 2
     --expert-ffn-hidden 128)
B8="--global-batch 8 --micro-batch 2"
# Memory. This tiny model's router is far from balanced (at init and while it learns: the
# busiest expert rank takes up to 1.61x the mean rows at ep 2, 1.98x at ep 4, as train prints),
# and a rank keeps what its experts receive. Each plan therefore carries the routing headroom a
# user would plan with (--routing-imbalance, the busiest expert's load), the Program sizes the
# experts' activations for the busiest rank from it, and `covered` checks that the run stayed
# within it; then the activations are asserted like every other category.
# Known gap, printed only: the buffers. The experts' backward takes its d_fc1, d_act and the
# all-to-all's buffers as scratch beside the runtime's one preallocated workspace arena (sized
# for a dense layer), and memory is sampled at op boundaries, so the measured buffers miss the
# transient the forecast holds (measured 37-45% under it).
covered() {  # name: the run's busiest expert rank took no more than the plan forecast
  local line
  line=$(grep "MoE routing" "$WORK/$1.log") || fail "$1: train printed no MoE routing line"
  $PY -c 'import re,sys; took, plan = map(float, re.search(r"took ([0-9.]+)x .* forecasts ([0-9.]+)x", sys.argv[1]).groups()); sys.exit(took > plan)' "$line" ||
    fail "$1: the routing exceeded the plan's headroom: $line"
  echo "ok: $1 routing within the plan's headroom (${line#*took })"
}
EP2="--routing-imbalance 3"     # the rank's load at ep 2 of 4 experts: 1 + 2/3 = 1.67x
EP4="--routing-imbalance 2.25"  # at ep 4 each rank holds one expert: 2.25x
PRINT_ONLY=buffers case_ ep2 2 MOE "$B8" "" "--dp 2 --ep 2 $EP2"
covered ep2
PRINT_ONLY=buffers case_ ep4 4 MOE "$B8" "" "--dp 4 --ep 4 $EP4"
covered ep4
PRINT_ONLY=buffers case_ ep2_dp2_z1 4 MOE "$B8" "" "--dp 4 --ep 2 --zero 1 $EP2"
covered ep2_dp2_z1
PRINT_ONLY=buffers case_ pp2_ep2 4 MOE "$B8" "" "--pp 2 --dp 2 --ep 2 $EP2"
covered pp2_ep2
PRINT_ONLY=buffers case_ ep4_z2 4 MOE "$B8" "" "--dp 4 --ep 4 --zero 2 $EP4"
covered ep4_z2
# Reshard: ep 2's checkpoint at step 3 (each expert saved whole, by the rank holding it)
# resumed on one rank that holds every expert ends at the serial run's step 5.
train_() {  # np name flags...
  local np=$1 name=$2; shift 2
  # shellcheck disable=SC2086
  timeout 120 "${MPIRUN[@]}" -np "$np" "$BIN" train "${MOE[@]}" $B8 --data "$WORK/data.bin" \
    --steps 5 --log-json "$WORK/$name.jsonl" --ckpt-dir "$WORK/rck" "$@" >"$WORK/$name.log" \
    2>&1 || fail "$name: $(tail -3 "$WORK/$name.log")"
}
train_ 2 rfirst --dp 2 --ep 2 --stop-after 3
train_ 1 rsecond --dp 1 --resume
grep -q "resumed from .*step-00000003.h5 at step 3" "$WORK/rsecond.log" || fail "no resume"
check weights "$WORK/ep2.serial/step-00000005.h5" "$WORK/rck/step-00000005.h5" 1e-5
echo "ok: ep 2 -> ep 1 reshard"
