#!/usr/bin/env bash
# The interop defects of issue 38 (D1-D13), each block running its reproducer: the inputs are the
# public Megatron-LM example scripts under test/data/megatron/ and the HF configs under
# test/data/hf/, each with its source.
set -euo pipefail
BIN=${STRATAGEM_BIN:?set STRATAGEM_BIN}
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=$HERE/../data
WORK=$(mktemp -d "${TMPDIR:-/tmp}"/stratagem-defects.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../cli_helpers.sh"
GPT3=$DATA/megatron/gpt3-175b.args

# A small Megatron job of our own, for the defects that any job shows.
cat >"$WORK/small.args" <<'ARGS'
--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
--max-position-embeddings 1024 --vocab-size 32000 --micro-batch-size 1 --global-batch-size 64
--tensor-model-parallel-size 2 --bf16
ARGS

# --- D6: a repeated switch is accepted as argparse accepts it; a repeated option takes its last --
cp "$WORK/small.args" "$WORK/twice.args"
echo "--use-distributed-optimizer --use-distributed-optimizer --micro-batch-size 2" \
  >>"$WORK/twice.args"
out=$("$BIN" plan import --from megatron --args-file "$WORK/twice.args" --nodes 1 --json)
[ "$(echo "$out" | json 'd["plan"]["micro_batch"]')" = 2 ] || fail "D6: the last --micro-batch-size"
[ "$(echo "$out" | json 'd["plan"]["layers"][0]["zero"]')" = 1 ] ||
  fail "D6: --use-distributed-optimizer twice is not ZeRO-1"

# --- D1: pretrain_gpt.py's default tokenizer, padded as Megatron pads; -- ARGS with --args-file ---
# No vocabulary flag: GPT2BPETokenizer's 50257 tokens padded to a multiple of 128 x tp 2 = 256.
grep -v -- --vocab-size "$WORK/small.args" >"$WORK/novocab.args"
echo "--max-position-embeddings 1024 --micro-batch-size 1 --global-batch-size 64" >>"$WORK/novocab.args"
out=$("$BIN" plan import --from megatron --args-file "$WORK/novocab.args" --nodes 1 --json)
[ "$(echo "$out" | json 'd["model"]["vocab"]')" = 50432 ] || fail "D1: GPT2BPETokenizer not padded"
# --make-vocab-size-divisible-by 64 x tp 2: 50304.
out=$("$BIN" plan import --from megatron --args-file "$WORK/novocab.args" --nodes 1 --json \
  -- --make-vocab-size-divisible-by 64)
[ "$(echo "$out" | json 'd["model"]["vocab"]')" = 50304 ] || fail "D1: divisible-by not read"
# The arguments after -- follow the file's and win where both give a flag.
out=$("$BIN" plan import --from megatron --args-file "$WORK/small.args" --nodes 1 --json \
  -- --vocab-size 50000 --micro-batch-size 2)
[ "$(echo "$out" | json 'd["model"]["vocab"], d["plan"]["micro_batch"]')" = "50000 2" ] ||
  fail "D1: the arguments after -- are not read after --args-file"
# Another tokenizer's vocabulary is in its files: refused, naming --vocab-size.
bad plan import --from megatron --args-file "$WORK/novocab.args" --nodes 1 \
  -- --tokenizer-type HuggingFaceTokenizer | has "flag --vocab-size: missing" ||
  fail "D1: HuggingFaceTokenizer without --vocab-size"

# --- D5: the user's --nodes wins over the file's --nnodes, and a note says so ---------------------
# The example is written for --nnodes 1; tp 8 x pp 16 needs 128 GPUs: 16 nodes.
out=$("$BIN" plan import --from megatron --args-file "$GPT3" --nodes 16 --json)
[ "$(echo "$out" | json 'd["nodes"]')" = 16 ] || fail "D5: --nodes 16 lost to the file's --nnodes 1"
# D1 on the example: GPT2BPETokenizer padded to a multiple of 128 x tp 8.
[ "$(echo "$out" | json 'd["model"]["vocab"]')" = 51200 ] || fail "D1: the example's vocabulary"
echo "$out" | json '"\n".join(d["notes"])' | has "--nodes 16 (command line) used instead of the file's --nnodes 1" ||
  fail "D5: no note of the file's --nnodes"
# Without --nodes the file's --nnodes 1 sets the size: 8 GPUs, which tp 8 x pp 16 does not divide.
bad plan import --from megatron --args-file "$GPT3" | has "does not divide the 8 GPUs" ||
  fail "D5: without --nodes the file's --nnodes is not read"

# --- D12: an HF config's served context is not the training sequence -----------------------------
# Llama-3.1-8B: 131072 positions served, 8192 pretrained (rope_scaling): the estimate trains at 8192.
EST=(--cluster dgx-a100-80g --nodes 1 --tp 8 --micro-batch 1 --global-batch 8 --json)
out=$("$BIN" estimate --model "$DATA/hf/llama3.1-8b.json" "${EST[@]}")
python3 -c "import json,sys; d=json.loads(sys.argv[1]); sys.exit(0 if d['fits'] else 1)" "$out" ||
  fail "D12: Llama-3.1-8B at tp 8 does not fit: the sequence is not 8192"
[ "$("$BIN" model import "$DATA/hf/llama3.1-8b.json" --json | json 'd["seq_len"]')" = 8192 ] ||
  fail "D12: Llama-3.1-8B does not train at 8192"
# Qwen2: 131072 positions and no shorter context stated: refused, asking for --seq-len.
bad estimate --model "$DATA/hf/qwen2-7b.json" "${EST[@]}" |
  has "max_position_embeddings': 131072 is the longest context the model serves.*give --seq-len" ||
  fail "D12: Qwen2 without --seq-len"
"$BIN" estimate --model "$DATA/hf/qwen2-7b.json" --seq-len 4096 --cluster dgx-a100-80g --nodes 1 \
  --tp 4 --micro-batch 1 --global-batch 8 >/dev/null

# --- D4: plan import and export --nearest say whether the forecast fits --------------------------
# The GPT-3 example on 16 nodes at pp 4 (dp 4) needs about 119 GiB per GPU: a warning, fits false.
out=$("$BIN" plan import --from megatron --args-file "$GPT3" --nodes 16 -- \
  --pipeline-model-parallel-size 4)
echo "$out" | has "warning: the forecast peak, .* DOES NOT FIT" || fail "D4: no warning: $out"
[ "$("$BIN" plan import --from megatron --args-file "$GPT3" --nodes 16 --json -- \
  --pipeline-model-parallel-size 4 | json 'd["fits"]')" = False ] || fail "D4: plan import fits"
out=$("$BIN" plan import --from megatron --args-file "$GPT3" --nodes 16)
! echo "$out" | grep -q "DOES NOT FIT" || fail "D4: a warning for a job that fits"
# ZeRO-3, which Megatron cannot state: both --nearest forecasts carry fits.
out=$("$BIN" export --to megatron --model gpt3-1.3b --cluster dgx-a100-80g --nodes 1 --tp 2 \
  --zero 3 --global-batch 64 --nearest --json)
[ "$(echo "$out" | json 'd["nearest"], d["forecast"]["plan"]["fits"], d["forecast"]["exported"]["fits"]')" = \
  "True True True" ] || fail "D4: export --nearest forecasts without fits"

# --- D2: --attention-backend fused / flash / auto is fused-kernel attention -----------------------
peak() {
  "$BIN" plan import --from megatron --args-file "$GPT3" --nodes 16 --json -- "$@" |
    json 'd["plan"]["flash_attention"], d["estimate"]["peak_memory_bytes"]'
}
auto=$(peak) fused=$(peak --attention-backend fused) flash=$(peak --attention-backend flash)
unfused=$(peak --attention-backend unfused)
[ "$auto" = "$fused" ] && [ "$auto" = "$flash" ] || fail "D2: auto $auto, fused $fused, flash $flash"
[ "${auto%% *}" = True ] && [ "${unfused%% *}" = False ] || fail "D2: auto $auto, unfused $unfused"
python3 -c "import sys; sys.exit(0 if ${unfused#* } > ${auto#* } else 1)" ||
  fail "D2: unfused attention ($unfused) not above flash ($auto)"
bad plan import --from megatron --args-file "$GPT3" --nodes 16 -- --attention-backend cudnn |
  has "flag --attention-backend: expected flash|fused|unfused|local|auto" || fail "D2: bad backend"

# --- D11: export --nearest writes only a plan that fits, or exits 3 --------------------------------
# Llama-2-13B at tp 2, ZeRO-3, micro-batch 4 needs about 200 GiB per GPU: each target's nearest
# plan gives memory back (distributed optimizer, recompute, micro-batch) until it fits in 80.
for t in megatron torchtitan deepspeed; do
  out=$("$BIN" export --to $t --model llama2-13b --cluster dgx-a100-80g --nodes 1 --tp 2 --zero 3 \
    --micro-batch 4 --global-batch 64 --nearest --json)
  [ "$(echo "$out" | json 'd["nearest"], d["refit_to_memory"], d["forecast"]["plan"]["fits"], d["forecast"]["exported"]["fits"]')" = \
    "True True False True" ] || fail "D11: $t --nearest exported a plan that does not fit"
  [ "$(echo "$out" | json 'd["plan"]["global_batch"], d["plan"]["pp"]')" = "64 1" ] ||
    fail "D11: $t --nearest changed the job, not only its memory"
done
# GPT-3 175B on one node does not fit however Megatron holds it: exit 3, one line saying so.
set +e
err=$("$BIN" export --to megatron --model gpt3-175b --cluster dgx-a100-80g --nodes 1 --tp 8 \
  --global-batch 64 --nearest 2>&1 >"$WORK/none.out")
rc=$?
set -e
[ $rc = 3 ] || fail "D11: exit $rc, not 3, when no plan fits"
[ ! -s "$WORK/none.out" ] && [ "$(echo "$err" | wc -l)" = 1 ] ||
  fail "D11: not one line, or a plan written: $err"
echo "$err" | has "no Megatron-LM plan near this one fits the memory budget" || fail "D11: $err"

# --- D3: flags that shape the plan are read, or refused naming them -------------------------------
# Megatron-Core's layout splits the example's 96 layers 5/6.../7 (first and last stage lighter
# and heavier), not 6 each.
out=$("$BIN" plan import --from megatron --args-file "$GPT3" --nodes 16 --json -- \
  --pipeline-model-parallel-layout 'Et*5|(t*6|)*14,t*7L')
[ "$(echo "$out" | json '[b - a for a, b in d["plan"]["chunks"]]')" = "[5$(printf ', 6%.0s' {1..14}), 7]" ] ||
  fail "D3: the layout's split not read"
echo "$out" | json '" ".join(d["ignored_flags"])' | grep -q -- --pipeline-model-parallel-layout &&
  fail "D3: the layout listed as not read"
# The pre-v3.0 recompute name: full recompute, as its current name; it was read as nothing.
old=$(peak --activations-checkpoint-method uniform)
now=$(peak --recompute-granularity full --recompute-method uniform)
[ "$old" = "$now" ] && [ "$old" != "$(peak)" ] || fail "D3: old $old, current $now, none $(peak)"
bad plan import --from megatron --args-file "$GPT3" --nodes 16 -- --fp8-format hybrid |
  has "flag --fp8-format: FP8 training is not modelled yet" || fail "D3: --fp8-format not refused"

# --- D13: usability -------------------------------------------------------------------------------
# A config saved from a local folder: _name_or_path is a path, not the model's name; the file names
# it. Llama-3.1-8B is torchtitan's llama3 flavor 8B.
python3 - "$DATA/hf/llama3.1-8b.json" "$WORK/my-llama.json" <<'EOF2'
import json, sys
d = json.load(open(sys.argv[1]))
d["_name_or_path"] = "/scratch/ckpt/llama-3.1/step-1000"
json.dump(d, open(sys.argv[2], "w"))
EOF2
[ "$("$BIN" model import "$WORK/my-llama.json" --json | json 'd["name"]')" = my-llama ] ||
  fail "D13: a local _name_or_path became the model's name"
TT=(--cluster dgx-a100-80g --nodes 1 --tp 8 --sequence-parallel --global-batch 8)
"$BIN" export --to torchtitan --model "$WORK/my-llama.json" "${TT[@]}" >"$WORK/tt.toml"
grep -qx 'flavor = "8B"' "$WORK/tt.toml" && grep -qx 'name = "llama3"' "$WORK/tt.toml" ||
  fail "D13: Llama-3.1-8B not exported as torchtitan's llama3 8B: $(grep -A2 '^\[model\]' "$WORK/tt.toml")"
# Another shape keeps its own name, for the user to register.
"$BIN" export --to torchtitan --model "$WORK/my-llama.json" --layers 16 "${TT[@]}" | grep -x 'flavor = "my-llama+overrides"' >/dev/null ||
  fail "D13: a 16-layer Llama named as a torchtitan flavor"
# plan import prices a Megatron job as Megatron-Core runs it; its "instead" line runs as pasted.
out=$("$BIN" plan import --from megatron --args-file "$WORK/small.args" --nodes 1 -- --micro-batch-size 2)
echo "$out" | has "forecast (estimate, framework megatron-core)" || fail "D13: not priced as megatron-core"
line=$(echo "$out" | sed -n 's/^what stratagem would run instead: //p')
echo "$line" | grep -q "MODEL.json\|see --model-out" && fail "D13: a placeholder in: $line"
(cd "$WORK" && PATH="$(cd "$(dirname "$BIN")" && pwd):$PATH" && eval "$line" >"$WORK/instead.out") ||
  fail "D13: the 'instead' line does not run: $line"

# The Megatron export writes RoPE's base, Llama 3's scaling, partial rotary and Qwen2's QKV biases
# (names held against test/data/frameworks/megatron-lm.txt), and reads them back the same.
check_rope() {  # config, expected flags..., after -- the import flags
  local cfg=$1 && shift
  local flags=() && while [ "$1" != -- ]; do flags+=("$1") && shift; done && shift
  "$BIN" export --to megatron --model "$DATA/hf/$cfg.json" "$@" -o "$WORK/$cfg.args" >/dev/null
  for f in "${flags[@]}"; do grep -qx -- "$f" "$WORK/$cfg.args" || fail "D13: $cfg: no '$f'"; done
  python3 "$HERE/check_names.py" megatron "$WORK/$cfg.args" "$DATA/frameworks/megatron-lm.txt" \
    >/dev/null || fail "D13: $cfg: a flag Megatron-LM does not accept"
  a=$("$BIN" model import "$DATA/hf/$cfg.json" "${@:1:2}" --json | json 'd.get("rope"), d.get("qkv_bias")')
  b=$("$BIN" plan import --from megatron --args-file "$WORK/$cfg.args" --nodes 1 --json |
    json 'd["model"].get("rope"), d["model"].get("qkv_bias")')
  [ "$a" = "$b" ] || fail "D13: $cfg: RoPE and QKV biases $a exported, $b read back"
}
check_rope llama3.1-8b "--rotary-base 500000" --use-rope-scaling "--rope-scaling-factor 8" -- \
  --seq-len 8192 --cluster dgx-a100-80g --nodes 1 --tp 8 --global-batch 8
check_rope qwen2-7b "--rotary-base 1000000" --add-qkv-bias -- \
  --seq-len 4096 --cluster dgx-a100-80g --nodes 1 --tp 4 --global-batch 8
check_rope gpt-neox-20b "--rotary-percent 0.25" -- \
  --seq-len 2048 --cluster dgx-a100-80g --nodes 1 --tp 8 --global-batch 8

echo "interop defects: all passed"
