#!/usr/bin/env bash
# CPU training throughput of gpt2-124m: stratagem against PyTorch (Debian's python3-torch on
# OpenBLAS) on the same machine, threads, batch and sequence length, measured in this run.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${STRATAGEM_BIN:-${BUILD:-build}/stratagem}
THREADS=${THREADS:-$(nproc)} BATCH=${BATCH:-4} SEQ=${SEQ:-512} STEPS=${STEPS:-2}
WORK=$(mktemp -d) && trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=$THREADS
blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | awk '/^Value:/{print $2}')
echo "BLAS behind python3-torch: ${blas:-unknown}"
case "$blas" in *openblas*) ;; *) echo "WARNING: PyTorch is not on OpenBLAS; the comparison would flatter stratagem";; esac
"$BIN" data tokenize /usr/share/common-licenses/GPL-3 -o "$WORK/d.bin" >/dev/null
MPIRUN=(mpirun -np 1 --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
"${MPIRUN[@]}" -x OMP_NUM_THREADS "$BIN" train --model gpt2-124m --seq-len "$SEQ" --micro-batch "$BATCH" \
  --global-batch "$BATCH" --dp 1 --backend cpu --data "$WORK/d.bin" --steps $((STEPS + 1)) --log-json "$WORK/s.jsonl" >/dev/null
ours=$(/usr/bin/python3 -c 'import json,sys; r=[json.loads(l)["tokens_per_s"] for l in open(sys.argv[1])][1:]; print(sum(r)/len(r))' "$WORK/s.jsonl")
theirs=$(/usr/bin/python3 test/bench/bench_train_cpu.py --batch "$BATCH" --seq "$SEQ" --threads "$THREADS" --steps "$STEPS" |
  /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')
/usr/bin/python3 - "$ours" "$theirs" "$THREADS" "$BATCH" "$SEQ" <<'PY'
import sys
ours, theirs, th, b, s = float(sys.argv[1]), float(sys.argv[2]), *sys.argv[3:]
print(f"gpt2-124m train step (fwd+bwd+AdamW), {th} threads, batch {b} x seq {s}:")
print(f"  stratagem {ours:9.1f} tokens/s")
print(f"  pytorch   {theirs:9.1f} tokens/s")
print(f"  ratio stratagem/pytorch = {ours/theirs:.2f} (goal >= 1.0)")
PY
