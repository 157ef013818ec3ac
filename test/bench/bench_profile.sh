#!/usr/bin/env bash
# Forecast against reality with and without a measured profile, side by side in one run:
#   1. `stratagem profile --quick` on NP ranks (cpu-local) -> measured.json, with the cost
#      model's error on the profile's own samples before and after the fit;
#   2. a short CPU training run (4-layer GPT, dp = NP) with a measured trace;
#   3. `stratagem simulate` of the same plan on cpu-local and on measured.json, each compared
#      op kind by op kind with the measured trace (`stratagem compare --json`).
# Prints the iteration-time error and the mean |error| over the compute op kinds for both.
# 4 ranks: cpu-local's 4 pseudo-GPUs per node (on a 2-core machine they share the cores, in the
# profile as in training).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${STRATAGEM_BIN:-${BUILD:-build}/stratagem}
PY=/usr/bin/python3
NP=4
WORK=$(mktemp -d /tmp/stratagem-bench-profile.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
MPIRUN=(mpirun --oversubscribe -np "$NP")
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
export OMP_NUM_THREADS=1

"${MPIRUN[@]}" "$BIN" profile --quick --cluster cpu-local -o "$WORK/measured.json" --json \
  > "$WORK/profile.json"
"$BIN" data tokenize /usr/share/common-licenses/GPL-3 -o "$WORK/data.bin" > /dev/null
MODEL=(--layers 4 --hidden 128 --heads 4 --vocab 256 --seq-len 64)
PLAN=(--dp "$NP" --micro-batch 4 --global-batch $((4 * NP)) --dtype fp32)
"${MPIRUN[@]}" "$BIN" train "${MODEL[@]}" "${PLAN[@]}" --data "$WORK/data.bin" --steps 20 \
  --log-every 20 --trace "$WORK/run.h5" > /dev/null
for c in cpu-local measured; do
  cluster=cpu-local
  [ $c = measured ] && cluster=$WORK/measured.json
  "$BIN" simulate "${MODEL[@]}" "${PLAN[@]}" --cluster "$cluster" --nodes 1 \
    --trace "$WORK/$c.h5" > /dev/null
  "$BIN" compare "$WORK/$c.h5" "$WORK/run.h5" --json > "$WORK/$c.json"
done
$PY - "$WORK" "$NP" <<'PY'
import json, sys
w, np_ = sys.argv[1], sys.argv[2]
p = json.load(open(f"{w}/profile.json"))
print(f"profile --quick on {np_} ranks: cost model error on its own samples, cpu-local -> measured")
for k in ("gemm", "attention", "stream", "all_reduce", "copy"):
    b, a = p["fit_error_before"][k + "_error_pct"], p["fit_error_after"][k + "_error_pct"]
    print(f"  {k:<11} {b:7.1f}% -> {a:6.1f}%")
print(f"training step (4-layer GPT, dp {np_}, 20 steps) forecast against its measured trace:")
print(f"  {'cluster file':<14} {'iteration time error':>22} {'mean |error| of compute ops':>30}")
for c in ("cpu-local", "measured"):
    j = json.load(open(f"{w}/{c}.json"))
    ops = [o for o in j["op_kinds"] if o["kind"].endswith(".compute") and o["measured_s"] > 0]
    mean = sum(abs(o["relative_error"]) for o in ops) / len(ops)
    print(f"  {c:<14} {100 * j['iteration_time_s']['relative_error']:21.1f}% {100 * mean:29.1f}%")
PY
