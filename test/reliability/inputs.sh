#!/usr/bin/env bash
# Hostile inputs (issue 41): JSON nested too deep, files that are not regular files, a NUL byte
# in a config, and nonsense flags. Each case crashed (SIGSEGV), ran out of memory, failed with
# exit 1 or was accepted with exit 0; each is now refused, exit 2, with one line naming it.
source "$(dirname "$0")/common.sh"
DATA=$(dirname "$0")/../../data
HF=$(dirname "$0")/../data/hf/llama3-8b.json
# nest FILE LEVELS OUT: FILE with a field "x" holding LEVELS nested arrays (the top object makes
# LEVELS + 1 levels in all); the readers ignore no field, except a Hugging Face config's.
nest() {
  python3 - "$@" <<'PY'
import sys
src, levels, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
text = open(src).read().rstrip()
assert text.endswith("}")
open(out, "w").write(text[:-1] + ', "x": ' + "[" * levels + "]" * levels + "}\n")
PY
}

# 1. A value nested 140,000 levels deep, in a field nobody reads: SIGSEGV before.
nest "$HF" 140000 "$WORK/deep-hf.json"
expect_rc 2 "$WORK/deep-hf.json: nested deeper than 128 levels" "$BIN" model import "$WORK/deep-hf.json"
expect_rc 2 "$WORK/deep-hf.json: nested deeper than 128 levels" \
  "$BIN" estimate --model "$WORK/deep-hf.json" --nodes 1 --global-batch 8
# The limit itself: 128 levels are read, 129 refused.
nest "$HF" 127 "$WORK/hf-128.json"
nest "$HF" 128 "$WORK/hf-129.json"
run "$BIN" model import "$WORK/hf-128.json"
[ "$rc" = 0 ] || fail "a config nested 128 levels is refused: $out"
expect_rc 2 "$WORK/hf-129.json: nested deeper than 128 levels" "$BIN" model import "$WORK/hf-129.json"
# Every other JSON input goes through the same reader.
nest "$DATA/models/gpt2-124m.json" 140000 "$WORK/deep-model.json"
nest "$DATA/clusters/cpu-local.json" 140000 "$WORK/deep-cluster.json"
nest "$DATA/frameworks/stratagem.json" 140000 "$WORK/deep-framework.json"
"$BIN" plan check --model gpt2-124m --nodes 1 --dp 8 --global-batch 8 -o "$WORK/plan.json" >/dev/null
nest "$WORK/plan.json" 140000 "$WORK/deep-plan.json"
expect_rc 2 "$WORK/deep-model.json: nested deeper than 128" "$BIN" model show --model "$WORK/deep-model.json"
expect_rc 2 "$WORK/deep-cluster.json: nested deeper than 128" \
  "$BIN" estimate --model gpt2-124m --cluster "$WORK/deep-cluster.json" --global-batch 8
expect_rc 2 "$WORK/deep-framework.json: nested deeper than 128" \
  "$BIN" estimate --model gpt2-124m --nodes 1 --global-batch 8 --framework "$WORK/deep-framework.json"
expect_rc 2 "$WORK/deep-plan.json: nested deeper than 128" \
  "$BIN" plan check --model gpt2-124m --nodes 1 --plan "$WORK/deep-plan.json"

# 2. Inputs must be regular files, refused before a byte is read: /dev/zero was read whole
# (exit 1, out of memory after 2 GB), a directory failed in the stream library (exit 1).
mkdir "$WORK/dir"
expect_rc 2 "--args-file /dev/zero: is not a regular file" \
  "$BIN" plan import --from megatron --args-file /dev/zero
expect_rc 2 "--args-file $WORK/dir: is a directory" \
  "$BIN" plan import --from megatron --args-file "$WORK/dir"
expect_rc 2 "/dev/zero: is not a regular file" "$BIN" model import /dev/zero
expect_rc 2 "/dev/zero: is not a regular file" "$BIN" model show --model /dev/zero
expect_rc 2 "/dev/zero: is not a regular file" "$BIN" data tokenize /dev/zero -o "$WORK/zero.bin"
expect_rc 2 "$WORK/dir: is a directory" "$BIN" data tokenize "$WORK/dir" -o "$WORK/dir.bin"
expect_rc 2 "--search /dev/zero: is not a regular file" "$BIN" report --search /dev/zero -o "$WORK/r.html"

# 3. A NUL byte ends nlohmann's input: what followed it was never read, and exit 0.
{ cat "$HF"; printf '\0'; } >"$WORK/nul-hf.json"
expect_rc 2 "$WORK/nul-hf.json: holds a NUL byte at offset" "$BIN" model import "$WORK/nul-hf.json"
{ cat "$HF"; printf '\0garbage'; } >"$WORK/nul2-hf.json"
expect_rc 2 "$WORK/nul2-hf.json: holds a NUL byte" "$BIN" estimate --model "$WORK/nul2-hf.json" \
  --nodes 1 --global-batch 8

# 4. Nonsense flags, accepted with exit 0 before.
E=("$BIN" estimate --model gpt2-124m --nodes 1 --global-batch 8)
expect_rc 2 "--offload: expected a comma list of optimizer, params, activations (or none), got ''" \
  "${E[@]}" --offload ''
expect_rc 2 "--offload: expected a comma list of optimizer, params, activations (or none), got ','" \
  "${E[@]}" --offload ','
expect_rc 2 "--offload: expected a comma list" "${E[@]}" --offload 'optimizer,'
expect_rc 2 "--routing-imbalance: the model gpt2-124m has no experts" "${E[@]}" --routing-imbalance 2
expect_rc 2 "--moe-node-limit: the model gpt2-124m has no experts" "${E[@]}" --moe-node-limit 2
expect_rc 2 "--cp-kind: names how context parallelism" "${E[@]}" --cp 1 --cp-kind a2a
expect_rc 2 "--cp-kind: names how context parallelism" "${E[@]}" --cp-kind ring
S=("$BIN" search --model gpt2-124m --nodes 1 --global-batch 8 --rerank estimator --quiet)
expect_rc 2 "flag --cp-degrees: cp 65536 does not divide the 8 GPUs" "${S[@]}" --cp-degrees 65536
expect_rc 2 "flag --cp-degrees: expected a comma list of degrees in [1, 65536], got ''" \
  "${S[@]}" --cp-degrees ''
expect_rc 2 "flag --cp-degrees: expected a comma list" "${S[@]}" --cp-degrees 2,
expect_rc 2 "flag --cp-degrees: cp 3 does not divide" "${S[@]}" --cp-degrees 3
expect_rc 2 "flag --limit: expected an integer in [1, 2147483647], got -1" \
  "$BIN" program dump --model gpt2-124m --nodes 1 --dp 8 --global-batch 8 --limit -1
# plan import: dropouts are probabilities, and Megatron-LM refuses --bf16 with --fp16.
MEG=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --vocab-size 256
  --micro-batch-size 1)
I=("$BIN" plan import --from megatron --cluster cpu-local --nodes 1)
run "${I[@]}" -- "${MEG[@]}" --attention-dropout 0 --hidden-dropout 1 --bf16
[ "$rc" = 0 ] || fail "a valid Megatron job is refused: $out"
for v in nan -1 inf; do
  expect_rc 2 "flag --attention-dropout: expected a probability in [0, 1], got '$v'" \
    "${I[@]}" -- "${MEG[@]}" --attention-dropout "$v"
done
expect_rc 2 "flag --hidden-dropout: expected a probability in [0, 1], got '7'" \
  "${I[@]}" -- "${MEG[@]}" --attention-dropout 0.1 --hidden-dropout 7
expect_rc 2 "flag --fp16: given with --bf16" "${I[@]}" -- "${MEG[@]}" --bf16 --fp16
echo ok
