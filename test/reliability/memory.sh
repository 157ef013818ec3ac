#!/usr/bin/env bash
# Unbounded memory (issue 30, item 4): each command estimates what it will hold before it
# allocates and refuses what does not fit, exit 2, naming the product. Run under ulimit -v, so
# that a missed estimate dies quickly instead of taking the machine's memory.
source "$(dirname "$0")/common.sh"
# AddressSanitizer reserves terabytes of address space: an instrumented binary cannot start under
# ulimit -v, and without it the refusals would be judged against physical memory. The regular
# build runs this test.
if ldd "$BIN" 2>/dev/null | grep libasan >/dev/null; then
  echo "SKIP: $BIN is built with AddressSanitizer (it cannot start under ulimit -v)"
  exit 77
fi
ulimit -v 4000000  # KiB: every refused job below needs far more, every accepted one far less
expect_rc 2 "the Program of 1048576 micro-batches (--global-batch 1048576 / (--micro-batch 1 x dp)) x 12 layers needs about" \
  "$BIN" simulate --model gpt2-124m --nodes 1 --tp 2 --pp 4 --global-batch 1048576
grep -q "this process may use (ulimit -v)" <<<"$out" || fail "the limit is not named: $out"
expect_rc 2 "up to 1073741824 micro-batches (--global-batch)) needs about" \
  "$BIN" search --model gpt2-124m --nodes 1 --global-batch 1073741824
expect_rc 2 "each simulating 8388608 ranks (--nodes 1048576)" \
  "$BIN" search --model gpt2-124m --nodes 1048576 --global-batch 8388608
expect_rc 2 "the training state (--layers 12 x --hidden 16384, --vocab 50257, micro-batch 1 x --seq-len 1024, 1 rank(s) on this node) needs about" \
  "${MPIRUN[@]}" -np 1 "$BIN" train --hidden 16384 --heads 16 --data "$WORK/data.bin" --steps 1
# What the estimate lets through but the address space does not hold (the estimate counts the
# tensors, not MPI's and the libraries' mappings): one worded line, exit 1, never a bare
# std::bad_alloc. The allocation fails at once: nothing near the limit is touched.
(
  ulimit -v 700000
  expect_rc 1 "stratagem train: error: out of memory: an allocation failed (this process may use 0.7 GiB: ulimit -v)" \
    "$BIN" train --layers 2 --hidden 1024 --heads 8 --vocab 256 --seq-len 32 --data "$WORK/data.bin" --steps 1
  ! grep -q "bad_alloc" <<<"$out" || fail "a bare bad_alloc: $out"
)
# What fits is not refused.
"$BIN" simulate --model gpt2-124m --nodes 1 --tp 2 --pp 4 --global-batch 64 >/dev/null ||
  fail "a small simulate was refused"
"${TRAIN[@]}" --data "$WORK/data.bin" --steps 1 >/dev/null || fail "a tiny train was refused"
echo ok
