#!/usr/bin/env bash
# Mixture-of-Experts and MLA models from the command line (issue #26, the model part):
# model show's total and active parameters of the built-ins against the published figures, the
# inline MoE flags, bad MoE input exiting 2 with one line naming the field or flag, an MLA model
# forecast at tp 1 and refused at tp 2, and every command that would price, run or write an MoE
# model as a dense one refusing it.
set -euo pipefail
BIN=${STRATAGEM_BIN:?set STRATAGEM_BIN}
WORK=$(mktemp -d "${TMPDIR:-/tmp}"/stratagem-moe-model.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../cli_helpers.sh"
within() { python3 -c "import sys; sys.exit(0 if abs($1 - $2) / $2 < $3 else 1)"; }

# --- the built-ins: total and active parameters (the issue's acceptance) ---------------------------
out=$("$BIN" model show mixtral-8x7b --json)
within "$(echo "$out" | json 'd["total_params"]')" 46.7e9 0.01 || fail "mixtral total"
within "$(echo "$out" | json 'd["active_params"]')" 12.9e9 0.01 || fail "mixtral active"
out=$("$BIN" model show deepseek-v3 --json)
within "$(echo "$out" | json 'd["total_params"]')" 671e9 0.02 || fail "deepseek-v3 total"
within "$(echo "$out" | json 'd["active_params"]')" 37e9 0.02 || fail "deepseek-v3 active"
echo "$out" | json 'd["left_out"]' | has "multi-token-prediction" || fail "deepseek-v3: MTP note"
[ "$(echo "$out" | json 'd["kv_cache_bytes_per_token"]')" = 70272 ] || fail "deepseek-v3 KV cache"
text=$("$BIN" model show deepseek-v3)
echo "$text" | has "active" || fail "model show: no active parameters"
echo "$text" | has "left out: 1 multi-token-prediction" || fail "model show: no MTP line"
# FLOPs per token come from the active parameters: 6 N_active (outside embeddings) or a little more.
out=$("$BIN" model show mixtral-8x7b --json)
python3 -c "import sys; f, a, e = $(echo "$out" | json 'd["flops_per_token"]'), \
$(echo "$out" | json 'd["active_params"]'), $(echo "$out" | json 'd["embedding_parameters"]'); \
sys.exit(0 if 6 * (a - e) < f < 7.2 * (a - e) else 1)" || fail "mixtral FLOPs per token"
# A dense model: total == active == parameters, no moe section.
out=$("$BIN" model show llama3-8b --json)
[ "$(echo "$out" | json 'd["total_params"] == d["active_params"] == d["parameters"]')" = True ] ||
  fail "dense model: total/active/parameters differ"
[ "$(echo "$out" | json '"moe" in d')" = False ] || fail "dense model has a moe section"

# --- inline MoE flags ------------------------------------------------------------------------------
TINY=(--layers 2 --hidden 64 --heads 4 --vocab 256 --seq-len 32)
out=$("$BIN" model show "${TINY[@]}" --experts 4 --top-k 2 --expert-ffn-hidden 128 --json)
[ "$(echo "$out" | json 'd["moe"]["experts"], d["moe"]["top_k"], d["moe"]["expert_ffn_hidden"]')" = \
  "4 2 128" ] || fail "inline MoE flags"
[ "$(echo "$out" | json 'd["active_params"] < d["total_params"]')" = True ] || fail "inline active"
out=$("$BIN" model show --model mixtral-8x7b --top-k 1 --shared-experts 1 --dense-layers 2 --json)
[ "$(echo "$out" | json 'd["moe"]["top_k"], d["moe"]["shared_experts"], d["moe"]["dense_layers"]')" = \
  "1 1 2" ] || fail "MoE overrides of a built-in"

# --- bad MoE input: exit 2, one line naming the field or the flag ----------------------------------
bad model show "${TINY[@]}" --experts 4 --top-k 5 | has "moe.top_k" || fail "top_k > experts"
bad model show "${TINY[@]}" --top-k 2 | has -- "--top-k: the model has no experts" || fail "--top-k alone"
bad model show "${TINY[@]}" --experts 4 | has -- "--experts: give --top-k" || fail "--experts alone"
bad model show "${TINY[@]}" --experts 4 --top-k 0 | has -- "--top-k" || fail "--top-k 0"
bad model show "${TINY[@]}" --experts 4 --top-k 2 --dense-layers 3 | has "moe.dense_layers" ||
  fail "dense_layers > layers"
bad model show "${TINY[@]}" --experts 4 --top-k 2 --shared-experts -1 | has -- "--shared-experts" ||
  fail "negative shared experts"
python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
base = {"name": "m", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 128, "vocab": 256,
        "seq_len": 32, "norm": "rmsnorm", "activation": "swiglu", "position": "rope",
        "tied_embeddings": False, "bias": False, "dropout": False}
json.dump(dict(base, moe={"experts": 4, "top_k": 6}), open(f"{work}/topk.json", "w"))
json.dump(dict(base, attention="mla"), open(f"{work}/nomla.json", "w"))
mla = {"q_lora_rank": 16, "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
       "v_head_dim": 8}
json.dump(dict(base, attention="mla", mla=mla), open(f"{work}/mla.json", "w"))
json.dump(dict(base, moe={"experts": 4, "top_k": 2}), open(f"{work}/moe.json", "w"))
PY
bad model show "$WORK/topk.json" | has "topk.json: field 'moe.top_k'" || fail "file: top_k > experts"
bad model show "$WORK/nomla.json" | has "field 'mla'" || fail "file: attention mla without section"

# --- MLA: forecast at tp 1, refused at tp 2 ------------------------------------------------------
PLAN=(--cluster dgx-h100 --nodes 1 --micro-batch 1 --global-batch 8 --json)
"$BIN" estimate --model "$WORK/mla.json" --tp 1 --dp 8 "${PLAN[@]}" | json 'd["iteration_time_s"]' >/dev/null ||
  fail "MLA estimate at tp 1"
"$BIN" simulate --model "$WORK/mla.json" --tp 1 --dp 8 "${PLAN[@]}" | json 'd["iteration_time_s"]' >/dev/null ||
  fail "MLA simulate at tp 1"
bad estimate --model "$WORK/mla.json" --tp 2 --dp 4 "${PLAN[@]}" |
  has "MLA attention with tp > 1 is not supported yet (issue #26)" || fail "MLA at tp 2"

# --- MoE models are priced with their experts (expert parallelism, #26); train and export wait ---
for cmd in estimate simulate; do
  out=$("$BIN" $cmd --model mixtral-8x7b --cluster dgx-h100 --nodes 1 --ep 8 --micro-batch 1 \
    --global-batch 8 --flash-attention --json)
  echo "$out" | json 'd["time_breakdown_s"]["ep_comm"] > 0 and d["exposed_comm_s"]["ep"] > 0' |
    has True || fail "$cmd: no ep_comm"
done
"$BIN" plan check --model mixtral-8x7b --cluster dgx-h100 --nodes 1 --ep 8 --micro-batch 1 \
  --global-batch 8 >/dev/null || fail "plan check of an MoE plan"
bad estimate --model mixtral-8x7b --cluster dgx-h100 --nodes 1 --ep 3 --global-batch 8 |
  has "layers\[0\].ep" || fail "ep not dividing the experts"
# --- MoE models: forecast, searched and trained (#26); the exporters refuse them ------------------
for cmd in estimate simulate "plan check" "program dump"; do
  # shellcheck disable=SC2086
  "$BIN" $cmd --model "$WORK/moe.json" --cluster dgx-h100 --nodes 1 --tp 1 --dp 8 --micro-batch 1 \
    --global-batch 8 >/dev/null || fail "$cmd of an MoE model"
done
bad export --to megatron --model deepseek-v3 --cluster dgx-h100 --nodes 1 --tp 1 --dp 8 \
  --micro-batch 1 --global-batch 8 | has "MoE models are not yet supported by export" || fail "export"
bad export --to megatron --model "$WORK/mla.json" --cluster dgx-h100 --nodes 1 --tp 1 --dp 8 \
  --micro-batch 1 --global-batch 8 | has "MLA attention (model m) is not yet supported by export" ||
  fail "export of MLA"
echo "moe model cli: all passed"
