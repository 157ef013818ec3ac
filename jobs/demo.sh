#!/usr/bin/env bash
# `make demo`: the main flow on built-in defaults, on this machine's CPUs.
# Each step runs only when the build has that subcommand, so the demo grows with the tool.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${STRATAGEM_BIN:-build/stratagem}
OUT=${DEMO_DIR:-out/demo}
mkdir -p "$OUT"
has() { "$BIN" --help | grep -q "^  $1 "; }
step() { printf '\n== %s\n' "$*"; }

MODEL=${MODEL:-gpt3-175b} CLUSTER=${CLUSTER:-dgx-a100-80g} NODES=${NODES:-128}
PLAN_FLAGS=${PLAN_FLAGS:---tp 8 --pp 16 --dp 8 --micro-batch 1 --global-batch 1536 --recompute full}

step "model: $MODEL"
"$BIN" model show "$MODEL"
step "plan check: $MODEL on $NODES x $CLUSTER ($PLAN_FLAGS)"
# shellcheck disable=SC2086
"$BIN" plan check --model "$MODEL" --cluster "$CLUSTER" --nodes "$NODES" $PLAN_FLAGS -o "$OUT/plan.json" | head -8
if has estimate; then
  step "estimate"
  "$BIN" estimate --model "$MODEL" --cluster "$CLUSTER" --nodes "$NODES" --plan "$OUT/plan.json"
fi
if has simulate; then
  step "simulate (every rank, virtual time)"
  "$BIN" simulate --model "$MODEL" --cluster "$CLUSTER" --nodes "$NODES" --plan "$OUT/plan.json" \
    --trace "$OUT/forecast.h5"
fi
REPORT=""
if has report && has simulate; then
  step "report: one HTML page of the forecast (timeline, memory, stage balance)"
  "$BIN" report --trace "$OUT/forecast.h5" -o "$OUT/report.html"
  REPORT="$OUT/report.html"
fi
if has search; then
  step "search: best strategy for $MODEL on 8 x $CLUSTER"
  "$BIN" search --model "$MODEL" --cluster "$CLUSTER" --nodes 8 --global-batch 1536 -o "$OUT/best.json" --top 5
fi
if has train; then
  step "train: a small GPT on 4 MPI ranks (CPU backend)"
  bash jobs/demo-train.sh "$OUT"
fi
printf '\ndemo outputs in %s\n' "$OUT"
[ -z "$REPORT" ] || printf 'report: %s (open it in a browser)\n' "$(cd "$(dirname "$REPORT")" && pwd)/$(basename "$REPORT")"
