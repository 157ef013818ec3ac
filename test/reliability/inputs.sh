#!/usr/bin/env bash
# Hostile inputs (issue 41): JSON nested too deep, files that are not regular files and a NUL
# byte in a config. Each case crashed (SIGSEGV), ran out of memory, failed with
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

echo ok
