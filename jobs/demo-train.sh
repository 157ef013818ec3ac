#!/usr/bin/env bash
# The training part of `make demo`: a small GPT on 4 MPI ranks (CPU backend, tp 2 x pp 2) trained on
# English text that Debian installs on every machine (/usr/share/common-licenses).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${STRATAGEM_BIN:-build/stratagem}
OUT=${1:-out/demo}
STEPS=${STEPS:-200}
mkdir -p "$OUT"
MPIRUN=(mpirun --oversubscribe -np 4)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cat /usr/share/common-licenses/{GPL-3,LGPL-3,Apache-2.0,MPL-2.0,Artistic,GFDL-1.3} > "$OUT/corpus.txt" 2>/dev/null || true
"$BIN" data tokenize "$OUT/corpus.txt" -o "$OUT/corpus.bin"
MODEL=(--layers 4 --hidden 128 --heads 4 --vocab 256 --seq-len 64)
# The CPU backend computes in fp32; the forecast uses the same dtype.
PLAN=(--tp 2 --pp 2 --dp 1 --micro-batch 4 --global-batch 16 --dtype fp32)
rm -rf "$OUT/ckpt"
"${MPIRUN[@]}" "$BIN" train "${MODEL[@]}" "${PLAN[@]}" --data "$OUT/corpus.bin" --steps "$STEPS" \
  --lr 3e-3 --warmup 20 --ckpt-dir "$OUT/ckpt" --ckpt-every 100 --log-every 25 \
  --log-json "$OUT/train.jsonl" --trace "$OUT/run.h5"
/usr/bin/python3 - "$OUT/train.jsonl" "$OUT/corpus.bin" <<'PY'
import json, sys, numpy as np
losses = [json.loads(l)["loss"] for l in open(sys.argv[1])]
tok = np.fromfile(sys.argv[2], dtype=np.uint16, offset=1024)
p = np.bincount(tok) / len(tok); p = p[p > 0]
h = float(-(p * np.log(p)).sum())
final = sum(losses[-10:]) / len(losses[-10:])
print(f"loss {losses[0]:.3f} -> {final:.3f} (mean of the last 10 steps); unigram entropy of the data {h:.3f} nats")
print("the model learned context" if final < 0.8 * h else "WARNING: loss is not well below the unigram entropy")
PY

# Forecast the same plan on the modeled cpu-local cluster, then put forecast and reality side
# by side, op kind by op kind.
"$BIN" simulate "${MODEL[@]}" "${PLAN[@]}" --cluster cpu-local --nodes 1 --trace "$OUT/forecast.h5" >/dev/null
"$BIN" compare "$OUT/forecast.h5" "$OUT/run.h5"
if "$BIN" --help | grep -q "^  report "; then
  "$BIN" report --trace "$OUT/forecast.h5" --measured "$OUT/run.h5" -o "$OUT/train-report.html"
fi
