#!/usr/bin/env bash
# Searched plans train end to end: `stratagem search -o plan.json` writes a plan, and
# `stratagem train --plan plan.json` runs it unchanged on the ranks it was searched for.
# H3T's case, scaled down: a per-rank budget so tight that only offload and recompute make the
# model fit. The searched plan must offload and recompute; stripped of either, the estimator
# puts it over the budget. Trained, it equals the serial run (losses 1e-5), and
# `stratagem compare` sets the simulator's forecast and the measurement side by side.
source "$(dirname "$0")/common.sh"
M=(--layers 8 --hidden 128 --heads 4 --vocab 512 --seq-len 64)
BUDGET_GIB=0.01
"$BIN" search "${M[@]}" --cluster cpu-local --nodes 1 --global-batch 8 --dtype fp32 \
  --memory-budget-gib $BUDGET_GIB --space zero --quiet -o "$WORK/plan.json" >"$WORK/search.txt" ||
  fail "search: $(tail -3 "$WORK/search.txt")"
$PY - "$WORK/plan.json" "$WORK" <<'PY' || fail "the searched plan is not the H3T case"
import json, sys
p = json.load(open(sys.argv[1]))
runs = p["layers"]
assert all(r["recompute"] == "full" for r in runs), [r["recompute"] for r in runs]
assert all(r["offload"]["optimizer"] and r["offload"]["params"] for r in runs), runs
# The same plan without offload, and without recompute, for the estimator.
for name, change in (("no-offload", lambda r: r.update(offload={"optimizer": False, "params": False, "activations": False})),
                     ("no-recompute", lambda r: r.update(recompute="none"))):
    q = json.loads(json.dumps(p))
    for r in q["layers"]: change(r)
    if name == "no-offload": change(q["embedding"])
    json.dump(q, open(f"{sys.argv[2]}/{name}.json", "w"))
print("searched:", p["description"])
PY
for variant in no-offload no-recompute; do
  "$BIN" estimate "${M[@]}" --cluster cpu-local --nodes 1 --plan "$WORK/$variant.json" --json \
    >"$WORK/$variant.est.json" || fail "estimate $variant"
  $PY - "$WORK/$variant.est.json" $BUDGET_GIB "$variant" <<'PY' || fail "$variant fits the budget"
import json, sys
e = json.load(open(sys.argv[1]))
peak, budget = e["peak_memory_bytes"], float(sys.argv[2]) * 2**30
assert peak > budget, (sys.argv[3], peak, budget)
print(f"ok: {sys.argv[3]}: estimated peak {peak} bytes > budget {budget:.0f}")
PY
done
run() {  # name np flags...
  local name=$1 np=$2; shift 2
  timeout 300 "${MPIRUN[@]}" -np "$np" "$BIN" train "${M[@]}" --data "$WORK/data.bin" --steps 3 \
    --log-json "$WORK/$name.jsonl" "$@" >"$WORK/$name.log" 2>&1 ||
    fail "$name: exit $?: $(tail -5 "$WORK/$name.log")"
}
run searched 4 --plan "$WORK/plan.json" --trace "$WORK/run.h5"
run serial 1 --global-batch 8 --micro-batch 2 --dp 1 --recompute full
$PY "$(dirname "$0")/check_run.py" losses "$WORK/serial.jsonl" "$WORK/searched.jsonl" 1e-5 ||
  fail "the searched plan's losses differ from the serial run's"
$PY -c 'import h5py,sys; print(h5py.File(sys.argv[1],"r").attrs["cluster"])' "$WORK/run.h5" \
  >"$WORK/cluster.json"
"$BIN" simulate "${M[@]}" --cluster "$WORK/cluster.json" --plan "$WORK/plan.json" --json \
  --trace "$WORK/forecast.h5" >"$WORK/forecast.json" || fail "simulate failed"
# Printed, not asserted: under ZeRO-3 with full recompute the runtime holds the layer above's
# staged gradients until their reduce-scatter lands, which the simulator does not count yet
# (measured 5-28% above the forecast; see the closing note of issue 12).
$PY "$(dirname "$0")/check_run.py" memory "$WORK/run.h5" "$WORK/forecast.json" 0.10 || true
"$BIN" compare "$WORK/forecast.h5" "$WORK/run.h5" >"$WORK/compare.txt" || fail "compare failed"
grep -q "peak memory" "$WORK/compare.txt" || fail "compare printed no peak memory: $(cat "$WORK/compare.txt")"
cat "$WORK/compare.txt"
echo "ok: H3T case: searched, trained, compared"
