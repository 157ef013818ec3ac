# A parallel run against its serial twin (sourced by parallel_equals_serial.sh,
# context_parallel.sh and moe_equals_serial.sh, after common.sh): the same model, global batch
# and seed on one rank.
# case_ checks losses over 5 steps and the final weights within the bounds that reordered fp32
# sums allow (derived from the run's reduction lengths, steps, learning rates and AdamW state:
# test/runtime/tolerance.py), and each memory category of the run's peak within 10% of the
# simulator's forecast for the same plan.
run() {  # name np model-and-plan flags...
  local name=$1 np=$2; shift 2
  timeout 120 "${MPIRUN[@]}" -np "$np" "$BIN" train --data "$WORK/data.bin" --steps 5 \
    --log-json "$WORK/$name.jsonl" --ckpt-dir "$WORK/$name" --trace "$WORK/$name.h5" "$@" \
    >"$WORK/$name.log" 2>&1 || fail "$name: exit $?: $(why_failed "$WORK/$name.log")"
}
check() {  # kind a b tol
  $PY "$(dirname "$0")/check_run.py" "$@" || fail "$2 vs $3"
}
# case name np model-flags plan-flags (serial twin: same model, batch and recompute, dp 1)
case_() {
  local name=$1 np=$2 model=$3 batch=$4 serial_flags=$5 plan=$6
  local twin=${SERIAL:-$name}  # SERIAL=other: compare with other's serial run (same twin)
  local -n m=$model
  local plan_batch=$batch dtype="--dtype fp32"  # a plan file holds its batch and dtype
  [[ $plan == --plan* ]] && plan_batch="" dtype=""
  # shellcheck disable=SC2086
  [ -f "$WORK/$twin.serial.jsonl" ] || run "$twin.serial" 1 "${m[@]}" $batch --dp 1 $serial_flags
  # shellcheck disable=SC2086
  run "$name" "$np" "${m[@]}" $plan_batch $plan
  check losses "$WORK/$twin.serial.jsonl" "$WORK/$name.jsonl" derived \
    "$WORK/$twin.serial/step-00000005.h5"
  check weights "$WORK/$twin.serial/step-00000005.h5" "$WORK/$name/step-00000005.h5" derived \
    "$WORK/$twin.serial.jsonl"
  # The forecast models the cluster the run was launched on (train writes it into its trace).
  $PY -c 'import h5py,sys; print(h5py.File(sys.argv[1],"r").attrs["cluster"])' "$WORK/$name.h5" \
    >"$WORK/$name.cluster.json"
  # shellcheck disable=SC2086
  "$BIN" simulate "${m[@]}" $plan_batch $plan $dtype --cluster "$WORK/$name.cluster.json" \
    --trace "$WORK/$name.forecast.h5" >/dev/null || fail "$name: simulate failed"
  check categories "$WORK/$name.h5" "$WORK/$name.forecast.h5" 0.10 "${PRINT_ONLY:-}"
  echo "ok: $name ($plan)"
}
