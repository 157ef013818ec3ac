#!/usr/bin/env bash
# Checkpoints hold whole logical tensors, so a run saved under one layout (per-layer ZeRO stages
# and per-layer tp/dp too) resumes under another:
# step 6 after resuming equals the uninterrupted run's step 6 (within the bound derived from
# the arithmetic, tolerance.py). And a checkpoint written
# by a sharded layout, read with h5py, holds exactly the serial run's tensors.
source "$(dirname "$0")/common.sh"
M8=(--layers 8 --hidden 64 --heads 4 --vocab 250 --seq-len 32 --global-batch 8 --micro-batch 1)
train() {  # np name flags...
  local np=$1 name=$2; shift 2
  timeout 120 "${MPIRUN[@]}" -np "$np" "$BIN" train "${M8[@]}" --data "$WORK/data.bin" \
    --steps 6 --log-json "$WORK/$name.jsonl" "$@" >"$WORK/$name.log" 2>&1 ||
    fail "$name: $(tail -3 "$WORK/$name.log")"
}
last_loss() { losses "$1" | tail -n 1; }
same() {  # a b: the last logged losses within the derived bound (every run here is M8, whose
  # reduction lengths the first checkpoint states)
  $PY "$(dirname "$0")/check_run.py" final_loss "$1" "$2" derived "$WORK/ck/step-00000005.h5" ||
    fail "step 6: $(last_loss "$1") vs $(last_loss "$2")"
}
# tp 2 x pp 2 x dp 2 (padded vocabulary) -> dp 4 with ZeRO-3 on 4 ranks (weights and optimizer
# state each a shard of the whole tensors).
HYB=(--tp 2 --pp 2 --dp 2)
train 8 straight "${HYB[@]}"
train 8 first "${HYB[@]}" --ckpt-dir "$WORK/ck" --stop-after 5
train 4 second --dp 4 --zero 3 --ckpt-dir "$WORK/ck" --resume
grep -q "resumed from .*step-00000005.h5 at step 5" "$WORK/second.log" || fail "no resume"
same "$WORK/straight.jsonl" "$WORK/second.jsonl"
echo "ok: tp 2 x pp 2 x dp 2 -> dp 4 ZeRO-3: step 6 loss $(last_loss "$WORK/second.jsonl")"
# ZeRO-Offload (weights and optimizer state in the host pool, AdamW there) -> tp 2 x pp 2 x dp 2
# on the device, and the same run's step 6.
train 4 ofirst --dp 4 --zero 3 --offload optimizer,params --ckpt-dir "$WORK/ock" --stop-after 5
train 8 osecond "${HYB[@]}" --ckpt-dir "$WORK/ock" --resume
same "$WORK/straight.jsonl" "$WORK/osecond.jsonl"
echo "ok: dp 4 ZeRO-3 offloaded -> tp 2 x pp 2 x dp 2: step 6 loss $(last_loss "$WORK/osecond.jsonl")"
# ... and back: tp 2 x pp 2 x dp 2 -> ZeRO-1 with the optimizer offloaded.
train 8 hfirst "${HYB[@]}" --ckpt-dir "$WORK/hck" --stop-after 5
# For the per-layer plans below (each resume saves step 6).
cp -r "$WORK/hck" "$WORK/hck2"
cp -r "$WORK/hck" "$WORK/hck3"
cp -r "$WORK/hck" "$WORK/hck4"
train 2 othird --dp 2 --zero 1 --offload optimizer --ckpt-dir "$WORK/hck" --resume
same "$WORK/straight.jsonl" "$WORK/othird.jsonl"
echo "ok: tp 2 x pp 2 x dp 2 -> dp 2 ZeRO-1 optimizer offloaded: step 6 loss $(last_loss "$WORK/othird.jsonl")"
MODEL8=("${M8[@]:0:10}")  # the model flags without the batch: the plan file holds it
# per_layer NAME NP NODES "SHORTHAND" 'LAYER' CKPT-TO-RESUME: a plan whose layer l is
# dict(run, layers=[l, l + 1], **eval(LAYER)), saved at step 5 -> tp 2 x pp 2 x dp 2, and
# CKPT-TO-RESUME (a copy of tp 2 x pp 2 x dp 2's) -> the plan; each step 6 equals the straight
# run's.
per_layer() {
  local name=$1 np=$2 nodes=$3 flags=$4 layer=$5 resume=$6
  # shellcheck disable=SC2086
  "$BIN" plan check "${M8[@]}" --cluster cpu-local --nodes "$nodes" --dtype fp32 $flags \
    -o "$WORK/$name.base.json" >/dev/null || fail "$name: plan check failed"
  $PY - "$WORK/$name.base.json" "$WORK/$name.json" "$layer" <<'PY' || fail "$name: cannot write the plan"
import json, sys
p = json.load(open(sys.argv[1]))
(run,) = p["layers"]
p["layers"] = [dict(run, layers=[l, l + 1], **eval(sys.argv[3])) for l in range(8)]
json.dump(p, open(sys.argv[2], "w"))
PY
  ptrain() {  # run flags...
    local run=$1; shift
    timeout 120 "${MPIRUN[@]}" -np "$np" "$BIN" train "${MODEL8[@]}" --plan "$WORK/$name.json" \
      --data "$WORK/data.bin" --steps 6 --log-json "$WORK/$run.jsonl" "$@" >"$WORK/$run.log" 2>&1 ||
      fail "$run: $(tail -3 "$WORK/$run.log")"
  }
  ptrain "$name.first" --ckpt-dir "$WORK/$name.ck" --stop-after 5
  train 8 "$name.second" "${HYB[@]}" --ckpt-dir "$WORK/$name.ck" --resume
  same "$WORK/straight.jsonl" "$WORK/$name.second.jsonl"
  echo "ok: $name -> tp 2 x pp 2 x dp 2: step 6 loss $(last_loss "$WORK/$name.second.jsonl")"
  ptrain "$name.third" --ckpt-dir "$resume" --resume
  grep -q "resumed from .*step-00000005.h5 at step 5" "$WORK/$name.third.log" || fail "no resume"
  same "$WORK/straight.jsonl" "$WORK/$name.third.jsonl"
  echo "ok: tp 2 x pp 2 x dp 2 -> $name: step 6 loss $(last_loss "$WORK/$name.third.jsonl")"
}
# Per-layer ZeRO stages (dp 4; layers alternate ZeRO-1 and ZeRO-3): each layer's pieces are
# hyperslabs of its whole tensors.
per_layer zero_1_3_per_layer 4 1 "--dp 4" '{"zero": 1 if l % 2 == 0 else 3}' "$WORK/hck2"
# Heterogeneous (tp, dp) per layer (tp 4 x dp 2 and tp 1 x dp 8 alternating, on 8 ranks): each
# layer's tensors are its own tp share.
per_layer tp4dp2_tp1dp8_per_layer 8 2 "--dp 8" '{"tp": 4, "dp": 2} if l % 2 == 0 else {}' \
  "$WORK/hck3"
# Weights and optimizer state offloaded layer by layer (AdamW's state of some layers in the
# host pool, of the others on the device).
per_layer offload_per_layer 4 1 "--dp 4 --zero 1" \
  '{"offload": {"optimizer": l % 2 == 0, "params": l % 4 == 0, "activations": False}}' \
  "$WORK/hck4"
# pp 4 interleaved (vpp 2) -> pp 1 on one rank.
VPP=(--pp 4 --dp 1 --schedule interleaved --vpp 2)
train 4 vstraight "${VPP[@]}"
train 4 vfirst "${VPP[@]}" --ckpt-dir "$WORK/vck" --stop-after 5
train 1 vsecond --dp 1 --ckpt-dir "$WORK/vck" --resume
same "$WORK/vstraight.jsonl" "$WORK/vsecond.jsonl"
echo "ok: pp 4 vpp 2 -> pp 1: step 6 loss $(last_loss "$WORK/vsecond.jsonl")"
# With lr 0 the weights stay the initial ones, which every layout draws identically: the
# sharded layout's checkpoint must hold the serial one's tensors bit for bit, in full shape.
train 1 s0 --dp 1 --lr 0 --min-lr 0 --ckpt-dir "$WORK/s0"
train 8 h0 "${HYB[@]}" --zero 1 --lr 0 --min-lr 0 --ckpt-dir "$WORK/h0"
$PY - "$WORK/s0/step-00000006.h5" "$WORK/h0/step-00000006.h5" <<'PY' || fail "tensors differ"
import h5py, sys
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    names = []
    a["params"].visit(lambda n: names.append(n) if isinstance(a["params"][n], h5py.Dataset) else None)
    assert a["params/wte"].shape == (250, 64), a["params/wte"].shape
    assert a["params/layers.0.attn.qkv.weight"].shape == (192, 64), "not the whole qkv"
    for n in names:
        x, y = a["params"][n][()], b["params"][n][()]
        assert x.shape == y.shape and x.tobytes() == y.tobytes(), n
print(f"ok: {len(names)} parameter tensors of the tp 2 x pp 2 x dp 2 checkpoint equal the serial one's bitwise")
PY
