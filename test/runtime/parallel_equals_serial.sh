#!/usr/bin/env bash
# mpirun -np 4 with dp 4 gives the losses of -np 1 with the same global batch (5 steps, 1e-6).
source "$(dirname "$0")/common.sh"
run() {  # name np extra-flags...
  local name=$1 np=$2; shift 2
  "${MPIRUN[@]}" -np "$np" "$BIN" train "${TINY[@]}" --data "$WORK/data.bin" --steps 5 \
    --global-batch 8 --micro-batch 2 --log-json "$WORK/$name.jsonl" "$@" >/dev/null
}
compare() {
  $PY - "$WORK/$1.jsonl" "$WORK/$2.jsonl" <<'PY'
import json, sys
a = [json.loads(l)["loss"] for l in open(sys.argv[1])]
b = [json.loads(l)["loss"] for l in open(sys.argv[2])]
assert len(a) == len(b) == 5, (a, b)
for x, y in zip(a, b):
    assert abs(x - y) <= 1e-6 * abs(x), f"{sys.argv[1]} vs {sys.argv[2]}: {x} != {y}"
print(f"ok {sys.argv[1].split('/')[-1]} == {sys.argv[2].split('/')[-1]}: {a}")
PY
}
for mode in "--zero 0" "--zero 1" "--recompute full" "--recompute selective --zero 1"; do
  tag=$(echo "$mode" | tr -d ' -')
  # shellcheck disable=SC2086
  run "serial$tag" 1 --dp 1 $mode
  # shellcheck disable=SC2086
  run "dp4$tag" 4 --dp 4 $mode
  compare "serial$tag" "dp4$tag"
done
# Recompute changes no numbers: full recompute equals none.
compare serialzero0 serialrecomputefull
