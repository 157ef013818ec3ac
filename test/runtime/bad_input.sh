#!/usr/bin/env bash
# Bad input to `train` fails with one clear line, exit 2, and overwrites nothing.
source "$(dirname "$0")/common.sh"
expect() {  # needle np args...
  expect_failure train "$@"
  echo "ok: $1"
}
head -c 40 "$WORK/data.bin" > "$WORK/short.bin"
printf 'hello' > "$WORK/tiny.txt"
"$BIN" data tokenize "$WORK/tiny.txt" -o "$WORK/tiny.bin" >/dev/null
expect "cannot open file" 1 "${TINY[@]}" --data "$WORK/missing.bin" --steps 1
expect "shorter than the 1024-byte" 1 "${TINY[@]}" --data "$WORK/short.bin" --steps 1
expect "too small for one sequence" 1 "${TINY[@]}" --data "$WORK/tiny.bin" --steps 1
expect "MPI started 2" 2 "${TINY[@]}" --data "$WORK/data.bin" --steps 1 --dp 4 --nodes 1
expect "no complete checkpoint" 1 "${TINY[@]}" --data "$WORK/data.bin" --steps 1 --ckpt-dir "$WORK/none" --resume
# A checkpoint of one model refuses to load into another.
"${MPIRUN[@]}" -np 1 "$BIN" train "${TINY[@]}" --data "$WORK/data.bin" --steps 1 --ckpt-dir "$WORK/ck" >/dev/null
before=$(md5sum "$WORK"/ck/*.h5)
expect "different model" 1 --layers 3 --hidden 64 --heads 4 --vocab 256 --seq-len 32 \
  --data "$WORK/data.bin" --steps 2 --ckpt-dir "$WORK/ck" --resume
# A truncated checkpoint is not taken for a complete one.
cp "$WORK"/ck/step-00000001.h5 "$WORK/trunc.h5"
mkdir -p "$WORK/ck2" && head -c 2000 "$WORK/trunc.h5" > "$WORK/ck2/step-00000001.h5"
expect "no complete checkpoint" 1 "${TINY[@]}" --data "$WORK/data.bin" --steps 2 --ckpt-dir "$WORK/ck2" --resume
[ "$before" = "$(md5sum "$WORK"/ck/*.h5)" ] || fail "a failed run changed an existing checkpoint"
echo ok
