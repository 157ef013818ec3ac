#!/usr/bin/env bash
# A full disk (issue 30, items 3 and 6): every writer exits 1 with one line naming the file and
# "no space left on device", leaves no half-written file under the name, and a checkpoint that
# does not fit keeps the earlier ones. The full disk is a small tmpfs mounted in a private mount
# namespace (unshare -m), so nothing outside the test sees it; where no namespace can be made
# the test skips (77).
if [ -z "${RELIABILITY_IN_NAMESPACE:-}" ]; then
  if ! unshare -m true 2>/dev/null; then
    echo "SKIP: no private mount namespace (unshare -m) for a small tmpfs"
    exit 77
  fi
  exec unshare -m env RELIABILITY_IN_NAMESPACE=1 bash "$0" "$@"
fi
source "$(dirname "$0")/common.sh"
# mount_full NAME KIB: a fresh tmpfs of KIB KiB at $WORK/NAME.
mount_full() {
  mkdir -p "$WORK/$1"
  mount -t tmpfs -o "size=${2}k" tmpfs "$WORK/$1" || { echo "SKIP: cannot mount a tmpfs"; exit 77; }
}
# fill DIR: takes every free block of DIR's file system.
fill() { dd if=/dev/zero of="$1/filler" bs=4k 2>/dev/null || true; }
trap 'for d in "$WORK"/full*; do umount "$d" 2>/dev/null; done; rm -rf "$WORK"' EXIT
NOSPACE="no space left on device"

mount_full full1 40   # the token file is 71 KB
expect_rc 1 "-o $WORK/full1/x.bin: $NOSPACE" "$BIN" data tokenize "$TEXT" -o "$WORK/full1/x.bin"
[ -z "$(ls -A "$WORK/full1")" ] || fail "a failed write left files: $(ls -A "$WORK/full1")"

"$BIN" simulate --model gpt2-124m --nodes 1 --tp 2 --pp 2 --global-batch 8 --trace "$WORK/t.h5" >/dev/null
mount_full full2 64   # the trace is 134 KB, its Chrome JSON 660 KB
expect_rc 1 "--chrome $WORK/full2/t.json: $NOSPACE" "$BIN" trace export "$WORK/t.h5" --chrome "$WORK/full2/t.json"
expect_rc 1 "$WORK/full2/t2.h5: $NOSPACE" \
  "$BIN" simulate --model gpt2-124m --nodes 1 --tp 2 --pp 2 --global-batch 8 --trace "$WORK/full2/t2.h5"
[ ! -e "$WORK/full2/t.json" ] || fail "a failed --chrome left $WORK/full2/t.json"
[ ! -e "$WORK/full2/t2.h5" ] || fail "a failed --trace left $WORK/full2/t2.h5 (was a 0-byte file)"

# Issue 41: a trace is written to a temporary name and renamed. A full disk keeps the previous
# good trace as it was (simulate wrote in place: "no digest, and no HDF5 superblock"), and
# leaves no temporary file (train left .m.h5.tmp.PID).
mount_full full5 256   # room for one trace (134 KB), not two
SIM=("$BIN" simulate --model gpt2-124m --nodes 1 --tp 2 --pp 2)
"${SIM[@]}" --global-batch 8 --trace "$WORK/full5/t.h5" >/dev/null
cp "$WORK/full5/t.h5" "$WORK/t5.orig"
# A larger trace (more micro-batches) than the room left, even with the old one's blocks freed.
expect_rc 1 "$WORK/full5/t.h5: $NOSPACE" "${SIM[@]}" --global-batch 64 --trace "$WORK/full5/t.h5"
cmp -s "$WORK/full5/t.h5" "$WORK/t5.orig" || fail "a failed --trace damaged the previous trace"
[ "$(ls -A "$WORK/full5")" = t.h5 ] || fail "a failed --trace left: $(ls -A "$WORK/full5")"
"$BIN" report --trace "$WORK/full5/t.h5" -o "$WORK/r.html" >/dev/null || fail "the kept trace does not read"
echo "ok: simulate --trace on a full disk keeps the previous trace"
mount_full full6 64
fill "$WORK/full6"
expect_rc 1 "$WORK/full6/m.h5: $NOSPACE" \
  "${TRAIN[@]}" --data "$WORK/data.bin" --steps 1 --trace "$WORK/full6/m.h5"
[ "$(ls -A "$WORK/full6")" = filler ] || fail "a failed train --trace left: $(ls -A "$WORK/full6")"
echo "ok: train --trace on a full disk leaves no file"

mount_full full3 64
fill "$WORK/full3"
expect_rc 1 "--log-json $WORK/full3/log.jsonl: $NOSPACE" \
  "${TRAIN[@]}" --data "$WORK/data.bin" --steps 2 --log-json "$WORK/full3/log.jsonl"
expect_rc 1 "--ckpt-dir $WORK/full3/ck: writing $WORK/full3/ck/LOCK: $NOSPACE" \
  "${TRAIN[@]}" --data "$WORK/data.bin" --steps 2 --ckpt-dir "$WORK/full3/ck"

# Room for one checkpoint (1.4 MB) but not two: the second fails, the first is kept and resumes.
mount_full full4 2200
expect_rc 1 "$NOSPACE (the earlier checkpoints are kept)" \
  "${TRAIN[@]}" --data "$WORK/data.bin" --steps 3 --ckpt-dir "$WORK/full4/ck" --ckpt-every 1 --keep 1
grep -q "writing $WORK/full4/ck/step-00000002.h5.tmp" <<<"$out" || fail "the line does not name the file: $out"
[ -f "$WORK/full4/ck/step-00000001.h5" ] || fail "the earlier checkpoint is gone: $(ls "$WORK/full4/ck")"
cp -r "$WORK/full4/ck" "$WORK/ck"
"${TRAIN[@]}" --data "$WORK/data.bin" --steps 3 --ckpt-dir "$WORK/ck" --resume >"$WORK/resume.log" 2>&1 ||
  fail "the kept checkpoint does not resume: $(tail -3 "$WORK/resume.log")"
grep -q "resumed from .*step-00000001.h5 at step 1" "$WORK/resume.log" || fail "$(cat "$WORK/resume.log")"
echo "ok: the kept checkpoint resumes"
echo ok
