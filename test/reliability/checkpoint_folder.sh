#!/usr/bin/env bash
# Checkpoint folders (issue 30, items 2, 5 and 8): a fresh run refuses a folder holding another
# run's checkpoints unless told (--resume or --overwrite); a checkpoint whose step attribute
# differs from its name is skipped; a FIFO under a checkpoint's name is ignored, never opened;
# a garbage LOCK is quoted in printable characters; another model's checkpoint names the field.
source "$(dirname "$0")/common.sh"
D=(--data "$WORK/data.bin")
"${TRAIN[@]}" "${D[@]}" --steps 2 --ckpt-dir "$WORK/ck" >/dev/null
before=$(md5sum "$WORK"/ck/*.h5)
expect_rc 2 "--ckpt-dir $WORK/ck holds 1 checkpoint(s) of another run (newest step-00000002.h5): pass --resume to continue it, or --overwrite to replace them" \
  "${TRAIN[@]}" "${D[@]}" --steps 3 --ckpt-dir "$WORK/ck"
[ "$before" = "$(md5sum "$WORK"/ck/*.h5)" ] || fail "a refused run changed the folder"
expect_rc 2 "--overwrite and --resume: give one" \
  "${TRAIN[@]}" "${D[@]}" --steps 3 --ckpt-dir "$WORK/ck" --resume --overwrite
expect_rc 2 "--overwrite needs --ckpt-dir" "${TRAIN[@]}" "${D[@]}" --steps 3 --overwrite
run "${TRAIN[@]}" "${D[@]}" --steps 1 --ckpt-dir "$WORK/ck" --overwrite
[ "$rc" = 0 ] || fail "--overwrite: exit $rc: $out"
grep -qF -- "--overwrite: removing 1 checkpoint(s) of another run from $WORK/ck" <<<"$out" || fail "$out"
[ "$(cd "$WORK/ck" && ls step-*.h5)" = step-00000001.h5 ] || fail "--overwrite left: $(ls "$WORK/ck")"
echo "ok: --overwrite replaces the other run's checkpoints"

# The step attribute against the name: a copy of step 1 named step 5 is skipped, not resumed
# at step 1 as if it were step 5.
mkdir "$WORK/renamed" && cp "$WORK/ck/step-00000001.h5" "$WORK/renamed/step-00000005.h5"
expect_rc 2 "step-00000005.h5: its step attribute (1) does not match its name (step 5)" \
  "${TRAIN[@]}" "${D[@]}" --steps 6 --ckpt-dir "$WORK/renamed" --resume

# A FIFO named like the newest checkpoint: ignored with a warning (opening it would block).
mkfifo "$WORK/ck/step-00000009.h5"
run timeout 60 "${TRAIN[@]}" "${D[@]}" --steps 2 --ckpt-dir "$WORK/ck" --resume
[ "$rc" = 0 ] || fail "a FIFO among the checkpoints: exit $rc: $out"
grep -qF "ignoring $WORK/ck/step-00000009.h5: not a regular file" <<<"$out" || fail "$out"
grep -q "resumed from .*step-00000001.h5 at step 1" <<<"$out" || fail "$out"
echo "ok: a FIFO named step-*.h5 is ignored"
rm "$WORK/ck/step-00000009.h5"

# A LOCK of garbage bytes (another host's, so not taken over): quoted printable, one line.
printf '\xff\xfe\x01\x1b[31mjob \x80 host elsewhere pid 1\n' >"$WORK/ck/LOCK"
expect_rc 2 "locked by another job (" "${TRAIN[@]}" "${D[@]}" --steps 3 --ckpt-dir "$WORK/ck" --resume
! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f-\xff]' <<<"$out" || fail "raw bytes echoed: $(od -c <<<"$out" | head)"
rm "$WORK/ck/LOCK"

# Another model's checkpoint: the message names the field that differs.
expect_rc 2 "checkpoint is of a different model than --model inline-gpt (ffn_hidden: 256 in the checkpoint, 512 in --model; hidden: 64 in the checkpoint, 128 in --model)" \
  "$BIN" train --layers 2 --hidden 128 --heads 4 --vocab 256 --seq-len 32 "${D[@]}" --steps 3 \
  --ckpt-dir "$WORK/ck" --resume
echo ok
