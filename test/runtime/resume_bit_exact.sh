#!/usr/bin/env bash
# 10 steps straight equal 5 steps, stop, resume for 5: losses and final weights bitwise, under
# dp 2 with ZeRO-1, under tp 2 x pp 2 x dp 2 (8 ranks), and under ZeRO-3 with the weights and
# optimizer state offloaded to the host pool (the host master copy is rebuilt on resume), and
# under the zero-bubble schedule zb-h2 (split backward) on pp 2 x dp 2.
source "$(dirname "$0")/common.sh"
for LAYOUT in "2 --dp 2 --zero 1" "8 --tp 2 --pp 2 --dp 2 --zero 1 --recompute selective" \
  "4 --dp 4 --zero 3 --offload optimizer,params,activations" "2 --dp 2 --zero 1 --offload optimizer" \
  "4 --pp 2 --dp 2 --zero 1 --schedule zb-h2"; do
NP=${LAYOUT%% *}
# shellcheck disable=SC2206
PLAN=(${LAYOUT#* })
rm -rf "$WORK/straight" "$WORK/split" "$WORK"/*.jsonl
train() {  # ckpt-dir log extra...
  local dir=$1 log=$2; shift 2
  timeout 120 "${MPIRUN[@]}" -np "$NP" "$BIN" train "${TINY[@]}" --data "$WORK/data.bin" "${PLAN[@]}" \
    --global-batch 8 --micro-batch 2 --steps 10 --warmup 2 --ckpt-dir "$dir" --log-json "$log" "$@"
}
train "$WORK/straight" "$WORK/straight.jsonl" >/dev/null
train "$WORK/split" "$WORK/split.jsonl" --stop-after 5 >/dev/null
[ "$(losses "$WORK/split.jsonl" | wc -l)" = 5 ] || fail "--stop-after 5 did not stop after 5 steps"
out=$(train "$WORK/split" "$WORK/split.jsonl" --resume)
grep -q "resumed from .*step-00000005.h5 at step 5" <<<"$out" || fail "did not resume from step 5: $out"
[ "$(losses "$WORK/straight.jsonl")" = "$(losses "$WORK/split.jsonl")" ] ||
  fail "losses differ: $(paste <(losses "$WORK/straight.jsonl") <(losses "$WORK/split.jsonl"))"
$PY - "$WORK/straight/step-00000010.h5" "$WORK/split/step-00000010.h5" <<'PY' || fail "final state differs"
import h5py, numpy as np, sys
def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys() and any(k.startswith("params/") for k in a), sorted(a)[:5]
for k in a:
    assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"
print(f"ok: {len(a)} datasets (params and optimizer state) bitwise equal")
PY
echo "ok (${PLAN[*]}): losses bitwise equal: $(losses "$WORK/split.jsonl" | tr '\n' ' ')"
done
