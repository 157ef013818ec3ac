#!/usr/bin/env bash
# Checkpoints you can trust (issue 17 defects 4, 5, 6, 7):
#   - a checkpoint's bytes are checked against the digest in its user block before libhdf5
#     opens it: damaged bytes, a file without a digest (older, or not a checkpoint), and files
#     on which libhdf5 itself crashes (test/fuzz/known-hdf5/) are skipped with a warning;
#   - damage behind a valid digest (an edit through h5py, the digest then rewritten by
#     file_digest.py: a NaN written into params/wte, a deleted dataset, garbled metadata) is
#     detected by the per-dataset checksums and the metadata checks;
#   - the damaged checkpoint is skipped with a warning naming it and the newest one that passes
#     is taken; when none passes, the error says so (exit 2);
#   - a second job on the same folder is refused by its lock; a stale lock and leftover .tmp
#     files of a killed job are cleaned up on resume;
#   - a non-finite loss stops training with a clear error and keeps the last good checkpoint;
#     --skip-nonfinite N goes on; the JSON log never holds NaN.
source "$(dirname "$0")/common.sh"
RUN=("${MPIRUN[@]}" -np 2 "$BIN" train "${TINY[@]}" --data "$WORK/data.bin" --dp 2 --zero 1
  --global-batch 8 --micro-batch 2)
# Digest chunks of 64 KiB (not 64 MiB), so that the 2 ranks hash ~20 chunks between them.
STRATAGEM_TEST_DIGEST_CHUNK_BYTES=65536 "${RUN[@]}" --steps 4 --ckpt-every 1 --keep 10 \
  --ckpt-dir "$WORK/ref" --log-json "$WORK/ref.jsonl" >/dev/null
[ ! -e "$WORK/ref/LOCK" ] || fail "the lock outlived the job"
DIGEST=("$PY" "$(dirname "$0")/file_digest.py")
reseal() { "${DIGEST[@]}" seal "$1"; }
# The digest, recomputed by an independent implementation, and the file still plain HDF5.
for s in 1 2 3 4; do "${DIGEST[@]}" check "$WORK/ref/step-0000000$s.h5"; done
$PY - "$WORK/ref/step-00000004.h5" <<'PY' || fail "h5py cannot read a checkpoint with a digest"
import h5py, sys
with h5py.File(sys.argv[1], "r") as f:
    assert f.userblock_size >= 4096 and f["params/wte"].shape[0] > 0, f.userblock_size
PY
if command -v h5dump >/dev/null; then
  h5dump -H "$WORK/ref/step-00000004.h5" >/dev/null || fail "h5dump cannot read a checkpoint"
fi
echo "ok: digest of 64 KiB chunks matches file_digest.py; h5py reads the file"
ck() { echo "$WORK/$1/step-0000000$2.h5"; }
fresh() {  # name: a copy of the reference checkpoints
  rm -rf "${WORK:?}/$1" && cp -r "$WORK/ref" "$WORK/$1"
}
resume() {  # name: resume to step 5; leaves output in $out, exit code in $rc
  set +e
  out=$("${RUN[@]}" --steps 5 --ckpt-dir "$WORK/$1" --resume 2>&1)
  rc=$?
  set -e
}
expect_skip() {  # name needle: resumes from step 3, skipping step 4 with the needle
  resume "$1"
  [ $rc -eq 0 ] || fail "$1: exit $rc: $out"
  grep -Eq "warning: skipping checkpoint .*step-00000004.h5: $2" <<<"$out" ||
    fail "$1: no warning '$2': $out"
  grep -q "resumed from .*step-00000003.h5 at step 3" <<<"$out" || fail "$1: not from step 3: $out"
  echo "ok: $1: $(echo "$out" | grep -m1 'skipping checkpoint')"
}
h5() { $PY - "$@"; }

# 64 bytes flipped in the middle of the file.
fresh flip64
size=$(stat -c %s "$(ck flip64 4)")
h5 "$(ck flip64 4)" "$((size / 2))" 64 <<'PY'
import sys
path, at, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with open(path, "r+b") as f:
    f.seek(at); b = bytearray(f.read(n)); f.seek(at); f.write(bytes(x ^ 0xFF for x in b))
PY
expect_skip flip64 "fails its digest \(damaged\): 1 of [0-9]+ chunks of 65536 bytes differ, the first at bytes \[[0-9]+, [0-9]+\)"

# 4 KB flipped inside params/wte (located through HDF5).
fresh flipwte
h5 "$(ck flipwte 4)" <<'PY'
import h5py, sys
with h5py.File(sys.argv[1], "r") as f:
    ds = f["params/wte"]; at, n = ds.id.get_offset(), ds.id.get_storage_size()
assert n >= 8192, n
with open(sys.argv[1], "r+b") as f:
    f.seek(at + n // 4); b = bytearray(f.read(4096)); f.seek(at + n // 4)
    f.write(bytes(x ^ 0x5A for x in b))
PY
cp "$(ck flipwte 4)" "$WORK/flipwte.h5"
expect_skip flipwte "fails its digest \(damaged\)"
# The same damage with the digest rewritten for it (a damaged write, hashed after the fact):
# the dataset's checksum, computed from memory before the write, still catches it.
fresh flipwte_resealed
cp "$WORK/flipwte.h5" "$(ck flipwte_resealed 4)" && reseal "$(ck flipwte_resealed 4)"
expect_skip flipwte_resealed "dataset 'params/wte' fails its checksum"

# A NaN written into params/wte through HDF5 (the file stays well-formed).
fresh nanwte
h5 "$(ck nanwte 4)" <<'PY'
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "r+") as f:
    f["params/wte"][3, 5] = np.nan
PY
reseal "$(ck nanwte 4)"
expect_skip nanwte "dataset 'params/wte' fails its checksum"

# A NaN with a matching checksum (a writer that hashed what it wrote) is still refused.
fresh nanhashed
h5 "$(ck nanhashed 4)" <<'PY'
import h5py, numpy as np, sys
M = (1 << 64) - 1
def h(i, v):
    bits = int(np.float32(v).view(np.uint32))
    x = ((i * 0x9E3779B97F4A7C15) & M) ^ (((bits << 17) | bits) & M)
    x ^= x >> 30; x = (x * 0xBF58476D1CE4E5B9) & M
    x ^= x >> 27; x = (x * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)
with h5py.File(sys.argv[1], "r+") as f:
    ds = f["params/wte"]; cols = ds.shape[1]; i = 3 * cols + 5
    old = ds[3, 5]; ds[3, 5] = np.nan
    s = (int(np.int64(ds.attrs["checksum"]).view(np.uint64)) - h(i, old) + h(i, np.float32("nan"))) & M
    ds.attrs["checksum"] = np.uint64(s).view(np.int64)
PY
reseal "$(ck nanhashed 4)"
expect_skip nanhashed "dataset 'params/wte' holds non-finite values"

# Damaged structure: a dataset gone (defect 5: was "no dataset ... (different model?)").
fresh nodataset
h5 "$(ck nodataset 4)" <<'PY'
import h5py, sys
with h5py.File(sys.argv[1], "r+") as f:
    del f["params/wte"]
PY
reseal "$(ck nodataset 4)"
expect_skip nodataset "dataset 'params/wte' is missing or unreadable"

# Damaged metadata: the model attribute garbled.
fresh badmeta
h5 "$(ck badmeta 4)" <<'PY'
import h5py, sys
with h5py.File(sys.argv[1], "r+") as f:
    f.attrs["model"] = "{\"name\": \"tin"
PY
reseal "$(ck badmeta 4)"
expect_skip badmeta "checkpoint metadata unreadable"

# An attribute read as one number that claims 64 (found by fuzz_checkpoint_h5: HDF5 wrote all
# 64 over the one on the stack, and the resume crashed).
fresh arrayattr
h5 "$(ck arrayattr 4)" <<'PY'
import h5py, numpy, sys
with h5py.File(sys.argv[1], "r+") as f:
    del f.attrs["step"]
    f.attrs["step"] = numpy.arange(64, dtype="<i8")
PY
reseal "$(ck arrayattr 4)"
expect_skip arrayattr "checkpoint metadata unreadable \(attribute step does not hold one value\)"

# A format_version that is not a number (found by fuzz_checkpoint_h5: exit 1, not a skip).
fresh badversion
h5 "$(ck badversion 4)" <<'PY'
import h5py, numpy, sys
with h5py.File(sys.argv[1], "r+") as f:
    del f.attrs["format_version"]
    f.attrs["format_version"] = numpy.bytes_(b"two")
PY
reseal "$(ck badversion 4)"
expect_skip badversion "checkpoint metadata unreadable \(attribute format_version is not an integer\)"

# A model attribute whose "name" is not a string (found by fuzz_checkpoint_h5: the "different
# model" message itself failed, exit 1): bad input, exit 2, without the unprintable name.
fresh badname
h5 "$(ck badname 4)" <<'PY'
import h5py, numpy, sys
with h5py.File(sys.argv[1], "r+") as f:
    f.attrs["model"] = numpy.bytes_(b'{"name": 5}')
PY
reseal "$(ck badname 4)"
resume badname
[ $rc -eq 2 ] && grep -q "step-00000004.h5: checkpoint is of a different model than --model inline-gpt (" <<<"$out" ||
  fail "model name not a string: exit $rc: $out"
echo "ok: a model attribute whose name is a number: exit 2"

# A checkpoint without a digest (as written before digests: the same datasets and checksums,
# no user block) cannot be verified before libhdf5 reads it: skipped.
fresh nodigest
h5 "$(ck nodigest 4)" <<'PY'
import h5py, os, sys
path = sys.argv[1]
with h5py.File(path, "r") as src, h5py.File(path + ".plain", "w") as dst:
    for k in src:
        src.copy(k, dst)
    for k, v in src.attrs.items():
        dst.attrs[k] = v
os.replace(path + ".plain", path)
PY
expect_skip nodigest "no digest \(an HDF5 file without a user block: written before digests\)"

# Files on which libhdf5 1.10.8 itself crashes or hangs (test/fuzz/known-hdf5/), as the newest
# checkpoint: without a digest; with the newest checkpoint's digest in front (a different
# size); and over the newest checkpoint's bytes after its user block (same size, digest kept).
# None reaches libhdf5: each is skipped with a warning, and the resume goes on from step 3.
KNOWN=$(cd "$(dirname "$0")/../fuzz/known-hdf5" && pwd)
n=0
for f in "$KNOWN"/*-in-*; do
  n=$((n + 1))
  fresh "known$n"
  cp "$f" "$(ck "known$n" 4)"
  expect_skip "known$n" "no digest \(an HDF5 file without a user block"
  fresh "known${n}b"
  { head -c 4096 "$(ck "known${n}b" 4)"; cat "$f"; } >"$WORK/spliced.h5"
  mv "$WORK/spliced.h5" "$(ck "known${n}b" 4)"
  expect_skip "known${n}b" "[0-9]+ bytes, its digest says [0-9]+ bytes \(cut short or extended\)"
  fresh "known${n}c"
  dd if="$f" of="$(ck "known${n}c" 4)" bs=4096 seek=1 conv=notrunc status=none
  expect_skip "known${n}c" "fails its digest \(damaged\)"
done
[ $n -ge 3 ] || fail "expected the 3 known-hdf5 reproducers, found $n"

# A folder of nothing but such files: exit 2, one error line saying none passes.
fresh damagedonly
n=0
for f in "$KNOWN"/*-in-*; do
  n=$((n + 1))
  cp "$f" "$(ck damagedonly $n)"
done
rm -f "$(ck damagedonly 4)"
resume damagedonly
[ $rc -eq 2 ] || fail "damaged only: exit $rc, expected 2: $out"
# One line of error (each rank that fails may print it, prefixed with its rank: the same line).
errors=$(grep "^stratagem train: error" <<<"$out" | sed 's/ on rank [0-9]*:/:/' | sort -u | wc -l)
[ "$errors" = 1 ] || fail "damaged only: $errors distinct error lines, expected 1: $out"
grep -q "no complete checkpoint in --ckpt-dir .*damagedonly passes verification (skipped: .*step-00000001.h5: no digest" <<<"$out" ||
  fail "damaged only: no error: $out"
echo "ok: a folder of libhdf5-crashing files only: exit 2: $(grep -m1 error <<<"$out" | cut -c1-160)..."

# None passes: the error says so, naming what was skipped.
fresh none
for s in 1 2 3 4; do
  h5 "$(ck none $s)" <<'PY'
import h5py, numpy as np, sys
with h5py.File(sys.argv[1], "r+") as f:
    f["params/wte"][0, 0] = 7.0
PY
  reseal "$(ck none $s)"
done
resume none
[ $rc -eq 2 ] || fail "none passes: exit $rc, expected 2: $out"
grep -q "no complete checkpoint in --ckpt-dir .*none passes verification (skipped: " <<<"$out" ||
  fail "none passes: no error: $out"
echo "ok: no checkpoint passes: exit 2"

# The lock refuses a second job while the first runs; the first is then stopped by SIGUSR1
# (checkpoint and exit 0) and releases it.
"${RUN[@]}" --steps 100000 --ckpt-dir "$WORK/busy" --log-json "$WORK/busy.jsonl" >"$WORK/busy.log" 2>&1 &
first=$!
wait_lines "$WORK/busy.jsonl" 2 "$first"
grep -q "^job .* host $(hostname) pid [0-9]*$" "$WORK/busy/LOCK" || fail "lock file: $(cat "$WORK/busy/LOCK")"
set +e
out=$("${RUN[@]}" --steps 2 --ckpt-dir "$WORK/busy" 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] || fail "second writer: exit $rc, expected 2: $out"
grep -q "ckpt-dir .*busy: locked by another job (job .* host $(hostname) pid " <<<"$out" ||
  fail "second writer: no message: $out"
echo "ok: second writer refused: $(echo "$out" | grep -m1 locked)"
kill -USR1 "$first"
wait "$first" || fail "the first job did not stop cleanly on SIGUSR1: $(tail "$WORK/busy.log")"
[ ! -e "$WORK/busy/LOCK" ] || fail "the lock outlived the first job"

# A killed job's stale lock (its process is gone) and its half-written file are cleaned up.
fresh stale
echo "job 99 host $(hostname) pid 999999999" >"$WORK/stale/LOCK"
echo "half" >"$WORK/stale/step-00000005.h5.tmp"
resume stale
[ $rc -eq 0 ] || fail "stale: exit $rc: $out"
grep -q "removing the lock of a job that is gone" <<<"$out" || fail "stale lock kept: $out"
grep -q "ignoring half-written checkpoint .*step-00000005.h5.tmp (removed)" <<<"$out" ||
  fail "no .tmp note: $out"
[ ! -e "$WORK/stale/step-00000005.h5.tmp" ] || fail ".tmp not removed"
grep -q "resumed from .*step-00000004.h5 at step 4" <<<"$out" || fail "stale: $out"
echo "ok: stale lock and .tmp removed"

# A lock of another host is never taken over.
fresh foreign
echo "job 7 host some-other-host pid 1" >"$WORK/foreign/LOCK"
resume foreign
[ $rc -eq 2 ] && grep -q "locked by another job (job 7 host some-other-host" <<<"$out" ||
  fail "foreign lock: exit $rc: $out"
echo "ok: another host's lock refused"

# Non-finite loss (defect 7): a learning rate of 1e30 blows the weights up at step 2.
set +e
out=$("${RUN[@]}" --steps 6 --lr 1e30 --warmup 0 --ckpt-dir "$WORK/nan" --ckpt-every 1 \
  --log-json "$WORK/nan.jsonl" 2>&1)
rc=$?
set -e
# A failure of training, not bad input: exit 1.
[ $rc -eq 1 ] || fail "non-finite loss: exit $rc, expected 1: $out"
grep -q "error on rank [01]: step [0-9]*: non-finite loss .*training stopped .*last good checkpoint .*step-0000000[0-9].h5 is kept" <<<"$out" ||
  fail "non-finite loss: no message: $out"
bad_step=$(echo "$out" | grep -om1 "step [0-9]*: non-finite" | grep -o "[0-9]*")
last_good=$((bad_step - 1))
[ -e "$(ck nan $last_good)" ] && [ ! -e "$(ck nan "$bad_step")" ] || fail "checkpoints: $(ls "$WORK/nan")"
h5 "$WORK/nan.jsonl" <<'PY' || fail "the JSON log holds a non-number"
import json, sys
def bad(x): raise ValueError("JSON holds " + x)
for line in open(sys.argv[1]):
    json.loads(line, parse_constant=bad)
PY
echo "ok: stopped at step $bad_step, kept step $last_good"
set +e
out=$("${RUN[@]}" --steps 6 --lr 1e30 --warmup 0 --skip-nonfinite 100 --log-json "$WORK/skip.jsonl" 2>&1)
rc=$?
set -e
[ $rc -eq 0 ] || fail "--skip-nonfinite 100: exit $rc: $out"
grep -q "update skipped (1 of 100 tolerated by --skip-nonfinite)" <<<"$out" || fail "no skip note: $out"
h5 "$WORK/skip.jsonl" <<'PY' || fail "the JSON log of skipped steps"
import json, sys
def bad(x): raise ValueError("JSON holds " + x)
rows = [json.loads(l, parse_constant=bad) for l in open(sys.argv[1])]
assert len(rows) == 6, rows
skipped = [r for r in rows if r.get("skipped")]
assert skipped and all(r["loss"] is None or r["grad_norm"] is None for r in skipped), rows
PY
echo "ok: --skip-nonfinite 100 ran 6 steps, JSON without NaN"
