#!/usr/bin/env bash
# Context parallelism (issue 27) equals the serial run: the sequence of 64 tokens split over cp
# ranks in 2 cp chunks (rank r holds chunks r and 2 cp - 1 - r), attention by the ring (K,V
# passed around, partial results merged by the online softmax, dK,dV sent back around), by the
# all-gather of K,V, or by DeepSpeed-Ulysses' all-to-alls, beside tp, pp and dp with ZeRO-3.
# Each case: losses over 5 steps and final weights within the derived bounds, and each memory
# category of the measured peak within 10% of the forecast (serial_twin.sh).
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/serial_twin.sh"
CPGPT=(--layers 4 --hidden 64 --heads 4 --vocab 256 --seq-len 64)
cat >"$WORK/llama64.json" <<'JSON'
{"name": "tiny-llama-64", "arch": "decoder", "norm": "rmsnorm", "activation": "swiglu",
 "position": "rope", "tied_embeddings": false, "bias": false, "dropout": false, "layers": 4,
 "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 96, "vocab": 256, "seq_len": 64}
JSON
CPLLAMA=(--model "$WORK/llama64.json")
B8="--global-batch 8 --micro-batch 2"
for kind in ring allgather a2a; do
  for cp in 2 4; do
    SERIAL=gpt case_ "cp${cp}_$kind" "$cp" CPGPT "$B8" "" "--cp $cp --cp-kind $kind --dp 1"
  done
done
SERIAL=gpt case_ cp2_tp2 4 CPGPT "$B8" "" "--cp 2 --tp 2 --dp 1"
# Sequence parallelism: the block's gathered input and output gradient outlive its cp parts.
SERIAL=gpt case_ cp2_tp2_sp 4 CPGPT "$B8" "" "--cp 2 --tp 2 --sequence-parallel --dp 1"
SERIAL=gpt case_ cp2_pp2 4 CPGPT "$B8" "" "--cp 2 --pp 2 --dp 1"
SERIAL=gpt case_ cp2_dp2_z3 4 CPGPT "$B8" "" "--cp 2 --dp 2 --zero 3"
# Full recompute: backward rebuilds each layer's forward, its cp communication included (the
# a2a kind keeps its whole-sequence head group in the q, k, v tensor's place).
SERIAL=gpt case_ cp2_ring_full 2 CPGPT "$B8" "" "--cp 2 --dp 1 --recompute full"
SERIAL=gpt case_ cp2_a2a_full 2 CPGPT "$B8" "" "--cp 2 --cp-kind a2a --dp 1 --recompute full"
# GQA (4 heads, 2 kv heads) with rotary positions: the K,V gathered are the kv heads'.
SERIAL=llama case_ cp2_allgather_gqa 2 CPLLAMA "$B8" "" "--cp 2 --cp-kind allgather --dp 1"
# One cp schedule: each case's runtime issued the Program's cp transfers, in their stream's
# order and moving the bytes the Program counts, and ran its attention parts (the simulator
# times the same ops).
for name in cp2_ring cp4_ring cp2_allgather cp4_allgather cp2_a2a cp4_a2a cp2_tp2 cp2_tp2_sp cp2_pp2 \
  cp2_dp2_z3 cp2_ring_full cp2_a2a_full cp2_allgather_gqa; do
  check cp_ops "$WORK/$name.h5" "$WORK/$name.forecast.h5"
done
# Checkpoints reshard across cp (a cp group's ranks hold the whole weights; ZeRO pieces are cut
# over dp x cp): cp 2 x dp 2 with ZeRO-1 saved at step 5 resumes on one rank, and the serial run
# saved at step 5 resumes under cp 4 (a2a); each step 6 equals the uninterrupted run's (within
# the derived bound).
ctrain() {  # np name flags...
  local np=$1 name=$2; shift 2
  timeout 120 "${MPIRUN[@]}" -np "$np" "$BIN" train "${CPGPT[@]}" $B8 --data "$WORK/data.bin" \
    --steps 6 --log-json "$WORK/$name.jsonl" "$@" >"$WORK/$name.log" 2>&1 ||
    fail "$name: $(tail -3 "$WORK/$name.log")"
}
step6() { losses "$1" | tail -n 1; }
same6() {  # a b checkpoint-of-the-same-model
  $PY "$(dirname "$0")/check_run.py" final_loss "$1" "$2" derived "$3" ||
    fail "step 6: $(step6 "$1") vs $(step6 "$2")"
}
ctrain 1 straight --dp 1
ctrain 4 cfirst --cp 2 --dp 2 --zero 1 --ckpt-dir "$WORK/cck" --stop-after 5
ctrain 1 csecond --dp 1 --ckpt-dir "$WORK/cck" --resume
grep -q "resumed from .*step-00000005.h5 at step 5" "$WORK/csecond.log" || fail "no resume"
same6 "$WORK/straight.jsonl" "$WORK/csecond.jsonl" "$WORK/cck/step-00000005.h5"
echo "ok: cp 2 x dp 2 ZeRO-1 -> serial: step 6 loss $(step6 "$WORK/csecond.jsonl")"
ctrain 1 sfirst --dp 1 --ckpt-dir "$WORK/sck" --stop-after 5
ctrain 4 ssecond --cp 4 --cp-kind a2a --dp 1 --ckpt-dir "$WORK/sck" --resume
same6 "$WORK/straight.jsonl" "$WORK/ssecond.jsonl" "$WORK/sck/step-00000005.h5"
echo "ok: serial -> cp 4 a2a: step 6 loss $(step6 "$WORK/ssecond.jsonl")"
