#!/usr/bin/env bash
# Outputs against inputs (issue 41): no output is a file the run reads or will read: one inside
# the checkpoint folder (whose checkpoints --resume reads, and whose files rotation, --overwrite
# and the lock's release remove), or the file a built-in name resolves to. Resume flags that
# contradict the checkpoint are refused, and a name from an input file that could inject a line
# into an exported job (or an escape code into the terminal) is refused naming the field.
# Every refusal is exit 2 with one line naming the flag or field, and leaves the files as they
# were. (Traces written through a temporary name: disk_full.sh. Checkpoints ordered by their
# step, not their name: unit.output_file.)
source "$(dirname "$0")/common.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
D=(--data "$WORK/data.bin")

# --- Outputs inside the checkpoint folder --------------------------------------------------
"${TRAIN[@]}" "${D[@]}" --steps 2 --ckpt-dir "$WORK/ck" >/dev/null
CK="$WORK/ck/step-00000002.h5"
before=$(md5sum "$WORK"/ck/*)
INSIDE="inside --ckpt-dir $WORK/ck, whose files the run reads, replaces and removes"
# Was exit 0 with the checkpoint replaced by the log (or the trace).
expect_rc 2 "--log-json $CK: $INSIDE" \
  "${TRAIN[@]}" "${D[@]}" --steps 3 --ckpt-dir "$WORK/ck" --resume --log-json "$CK"
expect_rc 2 "--trace $WORK/ck/step-00000004.h5: $INSIDE" \
  "${TRAIN[@]}" "${D[@]}" --steps 4 --ckpt-dir "$WORK/ck" --resume --trace "$WORK/ck/step-00000004.h5"
# Was deleted at exit together with the lock.
expect_rc 2 "--log-json $WORK/ck/LOCK: $INSIDE" \
  "${TRAIN[@]}" "${D[@]}" --steps 3 --ckpt-dir "$WORK/ck" --resume --log-json "$WORK/ck/LOCK"
# Any name inside it, by any spelling of the path, before the folder exists too.
expect_rc 2 "--log-json $WORK/ck/../ck/log.jsonl: $INSIDE" \
  "${TRAIN[@]}" "${D[@]}" --steps 3 --ckpt-dir "$WORK/ck" --resume --log-json "$WORK/ck/../ck/log.jsonl"
expect_rc 2 "--trace $WORK/fresh/t.h5: inside --ckpt-dir $WORK/fresh/," \
  "${TRAIN[@]}" "${D[@]}" --steps 1 --ckpt-dir "$WORK/fresh/" --trace="$WORK/fresh/t.h5"
# An input inside it: --overwrite (or rotation) would delete it. Was: the input deleted.
expect_rc 2 "--data $CK: inside --ckpt-dir $WORK/ck, whose files the run replaces and removes: keep inputs outside it" \
  "${TRAIN[@]}" --data "$CK" --steps 1 --ckpt-dir "$WORK/ck" --overwrite
[ "$before" = "$(md5sum "$WORK"/ck/*)" ] || fail "a refused run changed the checkpoint folder"
# A sibling whose name starts like the folder's is outside it.
run "${TRAIN[@]}" "${D[@]}" --steps 3 --ckpt-dir "$WORK/ck" --resume --log-json "$WORK/ck.jsonl"
[ "$rc" = 0 ] || fail "--log-json beside the folder: exit $rc: $out"
echo "ok: outputs and inputs inside --ckpt-dir are refused"

# --- Resume flags that contradict the checkpoint ---------------------------------------------
CK3="$WORK/ck/step-00000003.h5"
# Was: a silent continuation on the data stream of seed 99.
expect_rc 2 "--seed 99: the checkpoint $CK3 was written with seed 1234, and the data stream follows the seed: resume with --seed 1234" \
  "${TRAIN[@]}" "${D[@]}" --steps 4 --ckpt-dir "$WORK/ck" --resume --seed 99
# Was: exit 0, nothing done, nothing said.
expect_rc 2 "--steps 2: below the step of the checkpoint $CK3 (3): --resume trains on to --steps; give --steps 3 or more" \
  "${TRAIN[@]}" "${D[@]}" --steps 2 --ckpt-dir "$WORK/ck" --resume
run "${TRAIN[@]}" "${D[@]}" --steps 4 --ckpt-dir "$WORK/ck" --resume --seed 1234
[ "$rc" = 0 ] || fail "--resume with the checkpoint's seed: exit $rc: $out"
echo "ok: --seed and --steps that contradict the checkpoint are refused"

# --- Outputs that are the file a built-in name resolves to ------------------------------------
# On a copy of data/ ($STRATAGEM_DATA), so that a regression cannot damage the source tree's.
cp -r "$HERE/../../data" "$WORK/data"
export STRATAGEM_DATA="$WORK/data"
cp -r "$WORK/data" "$WORK/data.orig"
PLAN=(--nodes 1 --tp 1 --dp 8 --micro-batch 1 --global-batch 8)
cd "$WORK"
# Was: exit 0 and the model file replaced by the plan.
expect_rc 2 "-o data/models/gpt2-124m.json: the same file as --model gpt2-124m (an input, $WORK/data/models/gpt2-124m.json): refusing to overwrite it" \
  "$BIN" plan check --model gpt2-124m --cluster dgx-a100-80g "${PLAN[@]}" -o data/models/gpt2-124m.json
# The default cluster, named by no argument.
expect_rc 2 "-o data/clusters/dgx-a100-80g.json: the same file as --cluster dgx-a100-80g (an input" \
  "$BIN" export --to megatron --model gpt2-124m "${PLAN[@]}" -o data/clusters/dgx-a100-80g.json
# The default framework, by an absolute path.
expect_rc 2 "--trace $WORK/data/frameworks/stratagem.json: the same file as --framework stratagem (an input" \
  "$BIN" simulate --model gpt2-124m --nodes 1 --tp 2 --pp 2 --global-batch 8 \
  --trace "$WORK/data/frameworks/stratagem.json"
diff -r "$WORK/data" "$WORK/data.orig" >/dev/null || fail "a refused run changed data/"
echo "ok: outputs onto built-in files are refused"

# --- Names from input files --------------------------------------------------------------------
EVIL='evil\n--save /some/dir\n[job]\u001b[31m'
"$PY" - "$HERE/../data/hf/gpt2.json" "$WORK/evil.json" "$EVIL" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
j["_name_or_path"] = json.loads('"' + sys.argv[3] + '"')
json.dump(j, open(sys.argv[2], "w"))
EOF
FIELD="$WORK/evil.json: field '_name_or_path': expected a name of at most 200 letters, digits, spaces and ._-+/:@()[]~"
# Was: the name written raw into the job file, whose launch recipe passed --save to Megatron.
expect_rc 2 "$FIELD" "$BIN" export --to megatron --model "$WORK/evil.json" "${PLAN[@]}" -o "$WORK/job.args"
[ ! -e "$WORK/job.args" ] || fail "a refused export wrote $WORK/job.args"
expect_rc 2 "$FIELD" "$BIN" export --to torchtitan --model "$WORK/evil.json" "${PLAN[@]}"
expect_rc 2 "$FIELD" "$BIN" estimate --model "$WORK/evil.json" "${PLAN[@]}"
! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' <<<"$out" || fail "raw control bytes echoed: $(od -c <<<"$out" | head)"
sed 's/"name": "gpt2-124m"/"name": "x\\u001b]0;pwned\\u0007"/' data/models/gpt2-124m.json >"$WORK/m.json"
expect_rc 2 "$WORK/m.json: field 'name': expected a name" "$BIN" estimate --model "$WORK/m.json" "${PLAN[@]}"
# A safe name goes through.
sed 's/"_name_or_path": "[^"]*"/"_name_or_path": "openai-community\/gpt2"/' "$WORK/evil.json" >"$WORK/ok.json"
"$BIN" export --to megatron --model "$WORK/ok.json" "${PLAN[@]}" -o "$WORK/job.args" >/dev/null
grep -q "^# Megatron-LM pretrain_gpt.py arguments, written by stratagem export for openai-community/gpt2 on" \
  "$WORK/job.args" || fail "$(head -2 "$WORK/job.args")"
echo "ok: unsafe names from input files are refused"
echo ok
