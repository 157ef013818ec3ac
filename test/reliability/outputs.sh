#!/usr/bin/env bash
# Outputs (issue 30, items 1 and 3): every command that writes refuses a device node, FIFO or
# directory at its output path (exit 2 naming the path) and leaves it as it was, refuses an
# output that is one of its inputs, and refuses an empty name. The device node is a mknod copy of
# /dev/null in the test's own folder, never the real one.
source "$(dirname "$0")/common.sh"
mknod "$WORK/null" c 1 3
mkfifo "$WORK/fifo"
cp "$WORK/data.bin" "$WORK/data.orig"
"$BIN" simulate --model gpt2-124m --nodes 1 --tp 2 --pp 2 --global-batch 8 --trace "$WORK/t.h5" >/dev/null
SMALL=(--model gpt2-124m --cluster dgx-a100-80g --nodes 1 --tp 2 --pp 2 --global-batch 8)
for dev in "$WORK/null" "$WORK/fifo" /dev/full; do
  what="is not a regular file"
  expect_rc 2 "-o $dev: $what" "$BIN" data tokenize "$TEXT" -o "$dev"
  expect_rc 2 "-o $dev: $what" "$BIN" plan check "${SMALL[@]}" -o "$dev"
  expect_rc 2 "-o $dev: $what" "$BIN" search --model gpt2-124m --nodes 1 --global-batch 8 --rerank estimator -o "$dev"
  expect_rc 2 "-o $dev: $what" "$BIN" report --trace "$WORK/t.h5" -o "$dev"
  expect_rc 2 "--chrome $dev: $what" "$BIN" trace export "$WORK/t.h5" --chrome "$dev"
  expect_rc 2 "--trace $dev: $what" "$BIN" simulate "${SMALL[@]}" --trace "$dev"
  expect_rc 2 "--trace $dev: $what" "${TRAIN[@]}" --data "$WORK/data.bin" --steps 1 --trace "$dev"
  expect_rc 2 "--log-json $dev: $what" "${TRAIN[@]}" --data "$WORK/data.bin" --steps 1 --log-json "$dev"
done
[ -c "$WORK/null" ] || fail "the mknod copy of /dev/null is no longer a device node"
[ -p "$WORK/fifo" ] || fail "the FIFO is no longer a FIFO"
[ -c /dev/full ] || fail "/dev/full is no longer a device node"
expect_rc 2 "-o $WORK: is a directory" "$BIN" data tokenize "$TEXT" -o "$WORK"
expect_rc 2 "directory $WORK/none does not exist" "$BIN" data tokenize "$TEXT" -o "$WORK/none/x.bin"
# An output that is an input.
expect_rc 2 "-o $WORK/data.bin: the same file as the input $WORK/data.bin" \
  "$BIN" data tokenize "$WORK/data.bin" -o "$WORK/data.bin"
expect_rc 2 "--trace $WORK/data.bin: the same file as --data $WORK/data.bin (an input)" \
  "${TRAIN[@]}" --data "$WORK/data.bin" --steps 1 --trace "$WORK/data.bin"
expect_rc 2 "--log-json $WORK/data.bin: the same file as --data" \
  "${TRAIN[@]}" --data="$WORK/data.bin" --steps 1 --log-json="$WORK/data.bin"
cmp -s "$WORK/data.bin" "$WORK/data.orig" || fail "a refused run changed its input"
expect_rc 2 "--chrome $WORK/t.h5: the same file as the input $WORK/t.h5" \
  "$BIN" trace export "$WORK/t.h5" --chrome "$WORK/t.h5"
expect_rc 2 "-o $WORK/t.h5: the same file as --trace $WORK/t.h5 (an input)" \
  "$BIN" report --trace "$WORK/t.h5" -o "$WORK/t.h5"
expect_rc 2 "--trace $WORK/x.h5: the same file as --log-json" \
  "${TRAIN[@]}" --data "$WORK/data.bin" --steps 1 --trace "$WORK/x.h5" --log-json "$WORK/x.h5"
# An empty name (was exit 1).
expect_rc 2 "--trace: expected a file name, got an empty one" \
  "${TRAIN[@]}" --data "$WORK/data.bin" --steps 1 --trace ''
expect_rc 2 "-o: expected a file name, got an empty one" "$BIN" plan check "${SMALL[@]}" -o ''
# The rule does not refuse what it should write: a new file, and an existing regular one.
"$BIN" plan check "${SMALL[@]}" -o "$WORK/plan.json" >/dev/null
"$BIN" plan check "${SMALL[@]}" -o "$WORK/plan.json" >/dev/null
[ -f "$WORK/plan.json" ] || fail "plan check -o wrote nothing"
echo ok
