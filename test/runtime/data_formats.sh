#!/usr/bin/env bash
# The same tokens as an llm.c .bin and as an HDF5 /tokens dataset train to the same losses.
source "$(dirname "$0")/common.sh"
$PY - "$WORK/data.bin" "$WORK/data.h5" <<'PY'
import sys, numpy as np, h5py
tok = np.fromfile(sys.argv[1], dtype=np.uint16, offset=1024)
hdr = np.fromfile(sys.argv[1], dtype=np.int32, count=256)
assert hdr[0] == 20240520 and hdr[1] == 1 and hdr[2] == len(tok), hdr[:3]
with h5py.File(sys.argv[2], "w") as f:
    f["tokens"] = tok.astype(np.int32)
PY
for f in data.bin data.h5; do
  "${MPIRUN[@]}" -np 1 "$BIN" train "${TINY[@]}" --data "$WORK/$f" --steps 3 --global-batch 4 \
    --log-json "$WORK/$f.jsonl" >/dev/null
done
[ "$(losses "$WORK/data.bin.jsonl")" = "$(losses "$WORK/data.h5.jsonl")" ] || fail ".bin and .h5 differ"
# An HDF5 file without /tokens is refused by name.
$PY -c 'import h5py,sys; h5py.File(sys.argv[1],"w")["other"]=[1,2,3]' "$WORK/bad.h5"
set +e; out=$("${MPIRUN[@]}" -np 1 "$BIN" train "${TINY[@]}" --data "$WORK/bad.h5" --steps 1 2>&1); set -e
grep -q "no dataset '/tokens'" <<<"$out" || fail "bad HDF5 not reported: $out"
echo "ok: .bin and HDF5 token files give identical losses: $(losses "$WORK/data.h5.jsonl" | tr '\n' ' ')"
