#!/usr/bin/env bash
# `mpirun -np 2 stratagem search` gives the same best plan JSON (and the same ranked candidates,
# baselines and forecasts) as -np 1: the candidate space is dealt round-robin over the processes
# and ties are broken by the canonical plan key. Likewise --threads 3 (the re-rank's
# simulations run concurrently) against --threads 1.
set -euo pipefail
BIN=${STRATAGEM_BIN:?set STRATAGEM_BIN}
WORK=$(mktemp -d "${TMPDIR:-/tmp}"/stratagem-search.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*" >&2; exit 1; }

check() {  # name, search flags...
  local name=$1; shift
  "$BIN" search "$@" --threads 1 --quiet --json -o "$WORK/$name.np1.plan.json" > "$WORK/$name.np1.json"
  "${MPIRUN[@]}" -np 2 "$BIN" search "$@" --quiet --json -o "$WORK/$name.np2.plan.json" > "$WORK/$name.np2.json"
  "$BIN" search "$@" --threads 3 --quiet --json > "$WORK/$name.t3.json"
  cmp -s "$WORK/$name.np1.plan.json" "$WORK/$name.np2.plan.json" ||
    fail "$name: best plan JSON differs between -np 1 and -np 2"
  /usr/bin/python3 - "$WORK/$name.np1.json" "$WORK/$name.np2.json" "$name" "$WORK/$name.t3.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
name = sys.argv[3]
t3 = json.load(open(sys.argv[4]))
# candidates_evaluated is not compared: each process skips by its own K-th best.
for key in ("best", "baselines", "candidates", "scorer", "memory_budget_bytes"):
    assert a[key] == b[key], f"{name}: '{key}' differs between -np 1 and -np 2"
    assert a[key] == t3[key], f"{name}: '{key}' differs between --threads 1 and --threads 3"
assert a["stats"]["processes"] == 1 and b["stats"]["processes"] == 2, (a["stats"], b["stats"])
print(f"ok {name}: {a['best']['description']} at {a['best']['tokens_per_s']:.0f} tokens/s "
      f"({a['scorer']}), {a['candidates_evaluated']} plans; search {a['search_time_s']:.2f} s "
      f"at -np 1, {b['search_time_s']:.2f} s at -np 2")
PY
}

# Per-layer search with simulator re-rank (LLaMA: GQA, SwiGLU; two nodes).
check llama --model llama2-7b --cluster dgx-a100-80g --nodes 2 --global-batch 64 --top 4
# A tight budget on one node of 40 GB GPUs, ranked by the estimator alone.
check bert --model bert-huge-32 --cluster dgx-a100-40g --nodes 1 --global-batch 64 \
  --memory-budget-gib 8 --top 6 --rerank estimator
# A baseline space alone.
check megatron --model gpt2-350m --cluster dgx-a100-80g --nodes 1 --global-batch 32 --space megatron --top 3
