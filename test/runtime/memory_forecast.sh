#!/usr/bin/env bash
# Issue #12's memory acceptance on the plans of the issue that run today: for every rank, the
# measured peak of each memory category (weights, grads, optimizer, activations: each one's own
# peak over the step) and of the total is within 10% of the simulator's forecast for the same
# plan on the cluster the run was launched on (cpu-local). Tolerance: 10%, the issue's; a
# forecast that misses is a model to fix, not a number to loosen.
# Not asserted, printed: the buffers category (the estimator's static per-stage workspace
# against the runtime's transient scratch, see check_run.py categories).
source "$(dirname "$0")/common.sh"
GPT=(--layers 4 --hidden 64 --heads 4 --vocab 256 --seq-len 32)
cat >"$WORK/llama.json" <<'JSON'
{"name": "tiny-llama", "arch": "decoder", "norm": "rmsnorm", "activation": "swiglu",
 "position": "rope", "tied_embeddings": false, "bias": false, "dropout": false, "layers": 4,
 "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 96, "vocab": 256, "seq_len": 32}
JSON
LLAMA=(--model "$WORK/llama.json")
plan() {  # name np model batch plan-flags...
  local name=$1 np=$2 model=$3 batch=$4; shift 4
  local -n m=$model
  # shellcheck disable=SC2086
  timeout 120 "${MPIRUN[@]}" -np "$np" "$BIN" train "${m[@]}" $batch --data "$WORK/data.bin" \
    --steps 2 --trace "$WORK/$name.h5" "$@" >"$WORK/$name.log" 2>&1 ||
    fail "$name: exit $?: $(tail -5 "$WORK/$name.log")"
  $PY -c 'import h5py,sys; print(h5py.File(sys.argv[1],"r").attrs["cluster"])' "$WORK/$name.h5" \
    >"$WORK/$name.cluster.json"
  # shellcheck disable=SC2086
  "$BIN" simulate "${m[@]}" $batch "$@" --dtype fp32 --cluster "$WORK/$name.cluster.json" \
    --trace "$WORK/$name.forecast.h5" >/dev/null || fail "$name: simulate failed"
  $PY "$(dirname "$0")/check_run.py" categories "$WORK/$name.h5" "$WORK/$name.forecast.h5" 0.10 ||
    fail "$name: memory per category"
  echo "ok: $name ($*)"
}
B8="--global-batch 8 --micro-batch 2"
B16="--global-batch 16 --micro-batch 1"
plan dp4_z2 4 GPT "$B8" --dp 4 --zero 2
plan tp2_dp4_sp_z3_gqa 8 LLAMA "$B8" --tp 2 --dp 4 --sequence-parallel --zero 3
plan pp2_dp4_z3_offload_params 8 LLAMA "$B16" --pp 2 --dp 4 --zero 3 --offload params
plan dp8_z2_offload_optimizer 8 GPT "$B16" --dp 8 --zero 2 --offload optimizer
