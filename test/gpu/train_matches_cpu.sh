#!/usr/bin/env bash
# Training on the cuda backend equals the cpu backend's: a GPT-2 and a LLaMA (GQA, RoPE,
# SwiGLU) tiny model, 3 steps, losses to 1e-4 relative in fp32 (summation orders differ:
# fp32 GEMMs accumulate in another order) and 2e-2 in bf16 (GEMM operands rounded to bf16);
# and tp 2 x pp 2 on one GPU (--comm mpi, staged through host memory) equals 1 rank to 1e-5,
# as the cpu backend's parallel runs do (runtime.parallel_equals_serial); a run stopped and
# resumed from a checkpoint equals the straight one; NCCL on one rank equals staged MPI.
# Without a GPU: --backend cuda is refused with exit 2 and one "no CUDA device" line, and
# the test prints "skipped: no CUDA device (...)".
source "$(dirname "$0")/../runtime/common.sh"
GPT=(--layers 2 --hidden 64 --heads 4 --vocab 256 --seq-len 32)
cat >"$WORK/llama.json" <<'JSON'
{"name": "tiny-llama", "arch": "decoder", "norm": "rmsnorm", "activation": "swiglu",
 "position": "rope", "tied_embeddings": false, "bias": false, "dropout": false, "layers": 2,
 "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 96, "vocab": 256, "seq_len": 32}
JSON
LLAMA=(--model "$WORK/llama.json")
B8=(--global-batch 8 --micro-batch 2)

# A one-step probe: on a machine without a GPU it must be refused (exit 2, one line).
set +e
out=$("${MPIRUN[@]}" -np 1 "$BIN" train --backend cuda "${GPT[@]}" "${B8[@]}" \
  --data "$WORK/data.bin" --steps 1 --comm mpi --json 2>&1)
rc=$?
set -e
if grep -q "no CUDA device" <<<"$out"; then
  [ $rc -eq 2 ] || fail "exit $rc, not 2, for --backend cuda without a GPU: $out"
  [ "$(echo "$out" | grep -c 'no CUDA device')" -eq 1 ] || fail "not one line: $out"
  echo "skipped: no CUDA device ($(echo "$out" | grep -o 'no CUDA device: .*' | head -1 | cut -c17-))"
  exit 0
fi
[ $rc -eq 0 ] || fail "--backend cuda probe: exit $rc: $out"

run() {  # name np flags...
  local name=$1 np=$2; shift 2
  timeout 300 "${MPIRUN[@]}" -np "$np" "$BIN" train --data "$WORK/data.bin" --steps 3 \
    --log-json "$WORK/$name.jsonl" "$@" >"$WORK/$name.log" 2>&1 ||
    fail "$name: exit $?: $(tail -5 "$WORK/$name.log")"
}
check() {  # a b tol
  $PY "$(dirname "$0")/../runtime/check_run.py" losses "$WORK/$1.jsonl" "$WORK/$2.jsonl" "$3" ||
    fail "$1 vs $2"
  echo "ok: $2 matches $1 within $3"
}
for m in GPT LLAMA; do
  declare -n model=$m
  run "$m.cpu" 1 "${model[@]}" "${B8[@]}" --backend cpu
  run "$m.cuda32" 1 "${model[@]}" "${B8[@]}" --backend cuda --dtype fp32 --comm mpi
  run "$m.cuda16" 1 "${model[@]}" "${B8[@]}" --backend cuda --dtype bf16 --comm mpi
  check "$m.cpu" "$m.cuda32" 1e-4
  check "$m.cpu" "$m.cuda16" 2e-2
  # tp 2 x pp 2 on one GPU: four ranks share it through --comm mpi.
  run "$m.cuda_tp2pp2" 4 "${model[@]}" "${B8[@]}" --backend cuda --dtype fp32 --comm mpi \
    --tp 2 --pp 2 --dp 1
  check "$m.cuda32" "$m.cuda_tp2pp2" 1e-5
done
# Checkpoints from device memory: stop after 2 steps, resume for the third; the losses equal
# the straight run's (to 1e-6: the embedding's backward adds with atomics, in no fixed order).
run GPT.split 1 "${GPT[@]}" "${B8[@]}" --backend cuda --dtype fp32 --comm mpi \
  --ckpt-dir "$WORK/ckpt" --stop-after 2
run GPT.split 1 "${GPT[@]}" "${B8[@]}" --backend cuda --dtype fp32 --comm mpi \
  --ckpt-dir "$WORK/ckpt" --resume
grep -q "resumed from .*step-00000002.h5" "$WORK/GPT.split.log" || fail "did not resume at step 2"
check GPT.cuda32 GPT.split 1e-6
# NCCL on one rank (the only NCCL layout one GPU allows) equals the staged MPI run.
run GPT.nccl 1 "${GPT[@]}" "${B8[@]}" --backend cuda --dtype fp32 --comm nccl
check GPT.cuda32 GPT.nccl 1e-6
