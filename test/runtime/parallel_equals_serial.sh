#!/usr/bin/env bash
# Every parallel layout (tensor, sequence, pipeline and data parallel, ZeRO 1-3 also chosen layer
# by layer, offloading) equals the serial run with the same global batch and seed: losses over
# 5 steps and final weights (from the checkpoints, which hold the whole tensors) within the
# bounds that reordered fp32 sums allow, derived in test/runtime/tolerance.py. Each run's measured peak memory per rank, category by category (weights,
# grads, optimizer, activations, buffers) and in total, is within 10% of the simulator's
# forecast for the same plan on cpu-local (the tolerance of the issue: a forecast that misses
# is a model to fix, not a number to loosen).
# Known gaps, printed only (PRINT_ONLY=buffers, on the plans named below), in the token-stream
# scratch, which the forecast counts as one floor per stage (a stream, a partial sum, a send and
# a receive in flight) where the runtime's count changes with the phase: beside tensor
# parallelism and a pipeline the runtime holds fewer (-10 to -17%); a pipeline's sends stay in
# flight until the peer takes them, so how many meet at the peak varies run to run (pp 4 with 2
# micro-batches: -6.7% in most runs, -13.3% on one rank in one); under GPipe the last stage
# holds the head's input gradient of every micro-batch until the layers' backward (+14%). One
# stream tensor is 16 KiB here, 10-20% of the buffers; the totals stay within 2%.
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/tiny_models.sh"
ODD=(--layers 4 --hidden 64 --heads 4 --vocab 250 --seq-len 32)  # 250 = 4 x 62 + 2: padded
source "$(dirname "$0")/serial_twin.sh"
source "$(dirname "$0")/layer_plan.sh"
# layer_plan_ NAME MODEL "SHORTHAND" 'EDIT': $WORK/NAME.json (layer_plan.sh).
layer_plan_() {
  local -n lm=$2
  layer_plan "$WORK/$1.json" "$3" "$4" "${lm[@]}" || fail "$1: cannot write the plan"
}
B8="--global-batch 8 --micro-batch 2"
case_ tp2 2 GPT "$B8" "" "--tp 2 --dp 1"
case_ tp2_sp_gqa 2 LLAMA "$B8" "" "--tp 2 --dp 1 --sequence-parallel"
case_ tp4_padded_vocab 4 ODD "$B8" "" "--tp 4 --dp 1"
PRINT_ONLY=buffers case_ pp2_gpipe 2 GPT "$B8" "" "--pp 2 --dp 1 --schedule gpipe"
PRINT_ONLY=buffers case_ pp4_1f1b_2mb 4 GPT "--global-batch 4 --micro-batch 2" "" "--pp 4 --dp 1"
PRINT_ONLY=buffers case_ pp2_vpp2 2 GPT "$B8" "" "--pp 2 --dp 1 --schedule interleaved --vpp 2"
# (Buffers printed only: an interleaved pipeline's sends stay in flight until the peer takes
# them, so they vary run to run, 112-144 KiB against 120 forecast, as in memory_forecast.sh.)
PRINT_ONLY=buffers case_ pp4_vpp2 4 GPT8 "--global-batch 8 --micro-batch 1" "" "--pp 4 --dp 1 --schedule interleaved --vpp 2"
# Interleaved with micro-batches that are not a multiple of pp (Megatron-Core's groups per
# virtual stage): 5 in groups of 3 (schedules.py's own example, chosen by interleaved_group),
# and 8 in one group of all 8 on pp 4.
PRINT_ONLY=buffers case_ pp2_vpp2_5mb 2 GPT "--global-batch 5 --micro-batch 1" "" "--pp 2 --dp 1 --schedule interleaved --vpp 2"
PRINT_ONLY=buffers case_ pp4_vpp2_group8 4 GPT8 "--global-batch 8 --micro-batch 1" "" "--pp 4 --dp 1 --schedule interleaved --vpp 2 --microbatch-group 8"
PRINT_ONLY=buffers case_ tp2_pp2_dp2_selective 8 GPT "$B8" "--recompute selective" "--tp 2 --pp 2 --dp 2 --recompute selective"
case_ tp2_pp2_dp2_full_z1 8 GPT "$B8" "--recompute full" "--tp 2 --pp 2 --dp 2 --recompute full --zero 1"
case_ dp4_z1 4 GPT "$B8" "" "--dp 4 --zero 1"
case_ dp4_z2 4 GPT "$B8" "" "--dp 4 --zero 2"
PRINT_ONLY=buffers case_ tp2_dp2_z2 4 LLAMA "$B8" "" "--tp 2 --dp 2 --zero 2"
case_ dp4_z3 4 GPT "$B8" "" "--dp 4 --zero 3"
case_ tp2_dp4_sp_z3 8 LLAMA "$B8" "" "--tp 2 --dp 4 --sequence-parallel --zero 3"
PRINT_ONLY=buffers case_ tp2_pp2_dp2_z3_full 8 LLAMA "$B8" "--recompute full" "--tp 2 --pp 2 --dp 2 --zero 3 --recompute full"
# Offloading (ZeRO-Offload, ZeRO-Infinity, H3T): optimizer states and AdamW on the host, weights
# in the host pool copied up before use, saved activations down in forward and back in
# backward, each copy on its Program stream.
case_ dp2_z1_offload_opt_act 2 GPT "$B8" "" "--dp 2 --zero 1 --offload optimizer,activations"
PRINT_ONLY=buffers case_ tp2_pp2_dp2_offload_opt 8 GPT "$B8" "--recompute selective" "--tp 2 --pp 2 --dp 2 --zero 1 --offload optimizer --recompute selective"
case_ dp4_z3_offload_opt_params 4 LLAMA "$B8" "--recompute selective" "--dp 4 --zero 3 --offload optimizer,params --recompute selective"
case_ tp2_dp2_sp_z3_offload_all_full 4 LLAMA "$B8" "--recompute full" "--tp 2 --dp 2 --sequence-parallel --zero 3 --offload optimizer,params,activations --recompute full"
B16="--global-batch 16 --micro-batch 1"
case_ pp2_dp4_z3_offload_params 8 LLAMA "$B16" "" "--pp 2 --dp 4 --zero 3 --offload params"
case_ dp8_z2_offload_opt 8 GPT "$B16" "" "--dp 8 --zero 2 --offload optimizer"
# Per-layer ZeRO stages (Galvatron-BMW's per-layer DP/SDP, H3T's per-layer ZeRO): each layer's
# parameters have their own partition over the dp group, and each layer's stage decides what
# of it a rank keeps; recompute and activation offload differ by layer too.
ACT='{"optimizer": False, "params": False, "activations": True}'
layer_plan_ dp4_zero_per_layer GPT8 "--nodes 1 --dp 4 $B8" "p['embedding']['zero'] = 3
p['layers'] = [L(0, 1, zero=1), L(1, 2, zero=3), L(2, 3, zero=1), L(3, 4, zero=3),
               L(4, 5, zero=2, offload=$ACT), L(5, 6, zero=3, recompute='full'),
               L(6, 7, zero=1, offload=$ACT, recompute='full'), L(7, 8, zero=0)]"
case_ dp4_zero_per_layer 4 GPT8 "$B8" "" "--plan $WORK/dp4_zero_per_layer.json"
layer_plan_ tp2_dp2_sp_zero_per_layer LLAMA "--nodes 1 --tp 2 --dp 2 --sequence-parallel $B8" \
  "p['embedding']['zero'] = 1
p['layers'] = [L(0, 1, zero=3), L(1, 2, zero=2), L(2, 3, zero=1), L(3, 4, zero=3, recompute='full')]"
case_ tp2_dp2_sp_zero_per_layer 4 LLAMA "$B8" "" "--plan $WORK/tp2_dp2_sp_zero_per_layer.json"
# Weights and optimizer offloaded (the whole model), the ZeRO stage by layer.
layer_plan_ dp4_zero_per_layer_offload LLAMA "--nodes 1 --dp 4 --offload optimizer,params $B8" \
  "p['embedding']['zero'] = 3
p['layers'] = [L(0, 1, zero=1), L(1, 2, zero=3), L(2, 3, zero=2), L(3, 4, zero=0)]"
case_ dp4_zero_per_layer_offload 4 LLAMA "$B8" "" "--plan $WORK/dp4_zero_per_layer_offload.json"
# Weights offloaded layer by layer (H3T), the optimizer offloaded: each layer's weights in the
# host pool or on the device, AdamW on the host for all, the updated device weights copied up.
layer_plan_ dp4_params_offload_per_layer GPT "--nodes 1 --dp 4 --zero 1 --offload optimizer $B8" \
  "p['layers'] = [L(0, 1), L(1, 2), L(2, 3), L(3, 4)]
for r in p['layers'][0::2]: r['offload']['params'] = True"
case_ dp4_params_offload_per_layer 4 GPT "$B8" "" "--plan $WORK/dp4_params_offload_per_layer.json"
# ... and the optimizer offloaded layer by layer too: AdamW on the device for some layers, on
# the host for the others.
layer_plan_ dp4_offload_per_layer GPT "--nodes 1 --dp 4 --zero 1 $B8" \
  "O = {'optimizer': True, 'params': False, 'activations': False}
p['embedding']['offload'] = O
p['layers'] = [L(0, 1, offload=dict(O, params=True)), L(1, 2),
               L(2, 3, offload=dict(O, optimizer=False, params=True)), L(3, 4, offload=O)]"
case_ dp4_offload_per_layer 4 GPT "$B8" "" "--plan $WORK/dp4_offload_per_layer.json"
# Heterogeneous (tp, dp) per layer (the issue's plan): layers alternate between tp 4 x dp 2
# and tp 1 x dp 8 on 8 ranks; the stream is all-gathered over the reshard groups where dp
# shrinks and sliced where it grows (the gradient the other way round), each layer's weights
# are its own tp share with its own ZeRO partition; full recompute, activation offload and
# ZeRO stages differ by layer too.
layer_plan_ tp4dp2_tp1dp8_alternating GPT8 "--nodes 2 --dp 8 $B16" "p['layers'] = [
    L(0, 1, tp=4, dp=2), L(1, 2, recompute='full'), L(2, 3, tp=4, dp=2, offload=$ACT),
    L(3, 4, offload=$ACT), L(4, 5, tp=4, dp=2, recompute='full'), L(5, 6, zero=1),
    L(6, 7, tp=4, dp=2, zero=3, offload=$ACT, recompute='full'), L(7, 8, zero=2)]"
case_ tp4dp2_tp1dp8_alternating 8 GPT8 "$B16" "" "--plan $WORK/tp4dp2_tp1dp8_alternating.json"
# ... across pipeline stages: the stream crosses the stage boundary in the sending layer's
# layout (tp 2 x dp 2 -> tp 1 x dp 4: sliced by the receiver; its gradient gathered before
# being sent back), and tp 4 x dp 1 beside tp 2 x dp 2.
layer_plan_ pp2_tp_per_layer GPT8 "--nodes 2 --pp 2 --dp 4 $B16" "p['layers'] = [
    L(0, 1), L(1, 2, tp=2, dp=2), L(2, 3, zero=1), L(3, 4, tp=2, dp=2, recompute='full'),
    L(4, 5, zero=3), L(5, 6, tp=4, dp=1), L(6, 7, tp=2, dp=2, zero=1), L(7, 8)]"
PRINT_ONLY=buffers case_ pp2_tp_per_layer 8 GPT8 "$B16" "" "--plan $WORK/pp2_tp_per_layer.json"
# The first and last layers in another (tp, dp) than the embedding and LM head: the stream is
# resharded from the embedding into the first layer and from the last layer into the head
# (gathered into the head's tp 2 x dp 2 from tp 1 x dp 4; the loss's gradient gathered back
# from the head's tp 1 x dp 4 into a last layer of tp 2 x dp 2).
layer_plan_ head_reshard_gather_fwd GPT "--nodes 1 --tp 2 --dp 2 $B8" "p['layers'] = [
    L(0, 1, tp=1, dp=4), L(1, 3, zero=1), L(3, 4, tp=1, dp=4, recompute='full')]"
case_ head_reshard_gather_fwd 4 GPT "$B8" "" "--plan $WORK/head_reshard_gather_fwd.json"
layer_plan_ head_reshard_gather_bwd GPT "--nodes 1 --dp 4 $B8" "p['layers'] = [
    L(0, 3, zero=2), L(3, 4, tp=2, dp=2, zero=1)]"
PRINT_ONLY=buffers case_ head_reshard_gather_bwd 4 GPT "$B8" "" "--plan $WORK/head_reshard_gather_bwd.json"
# Sequence parallelism beside per-layer tp: a sequence-parallel layer holds one token shard per
# rank, as a tp 1 layer holds its samples (piece i of the stage's micro-batch on rank i), so
# nothing moves between them; into a tp > 1 layer without it the shards are gathered over the
# reshard group (the tp group). tp 2 x dp 2 SP -> tp 1 -> tp 4 SP -> tp 2 x dp 2 -> the head's
# tp 1 x dp 4; and from an SP embedding (tp 2) through tp 1, tp 2 SP, tp 4 into an SP head.
layer_plan_ sp_per_layer GPT "--nodes 1 --dp 4 $B8" "p['layers'] = [
    L(0, 1, tp=2, dp=2, sequence_parallel=True, zero=3), L(1, 2),
    L(2, 3, tp=4, dp=1, sequence_parallel=True, recompute='full'), L(3, 4, tp=2, dp=2, zero=1)]"
case_ sp_per_layer 4 GPT "$B8" "" "--plan $WORK/sp_per_layer.json"
layer_plan_ sp_embedding_per_layer GPT "--nodes 1 --tp 2 --dp 2 --sequence-parallel $B8" \
  "p['layers'] = [L(0, 1, tp=1, dp=4, sequence_parallel=False), L(1, 3, zero=2),
    L(3, 4, tp=4, dp=1, sequence_parallel=False, offload=$ACT)]"
case_ sp_embedding_per_layer 4 GPT "$B8" "" "--plan $WORK/sp_embedding_per_layer.json"
# ... and with one tp throughout: tp 2 x dp 2 with sequence parallelism in the embedding, head
# and layers 0 and 3, without it in layers 1-2 (their stream gathered over the tp group).
layer_plan_ sp_differs_same_tp LLAMA "--nodes 1 --tp 2 --dp 2 --sequence-parallel $B8" \
  "p['layers'] = [L(0, 1), L(1, 3, sequence_parallel=False), L(3, 4)]"
case_ sp_differs_same_tp 4 LLAMA "$B8" "" "--plan $WORK/sp_differs_same_tp.json"
# Tied word embeddings split over pipeline stages under ZeRO-2/3: both stages stage the copies'
# gradients whole until their sum, once per iteration, then reduce-scatter them.
PRINT_ONLY=buffers case_ pp2_dp2_z2_tied 4 GPT "$B8" "" "--pp 2 --dp 2 --zero 2"
# Under ZeRO-3 the same equality holds; its peak is not checked here yet: the simulator counts a
# layer's staged gradients in forward too (a static workspace term), 10-11% above the measured
# peak of the first stage (see the closing note of issue 12).
run tp2_pp2_dp2_z3_tied.serial 1 "${GPT[@]}" $B8 --dp 1
run tp2_pp2_dp2_z3_tied 8 "${GPT[@]}" $B8 --tp 2 --pp 2 --dp 2 --zero 3
check losses "$WORK/tp2_pp2_dp2_z3_tied.serial.jsonl" "$WORK/tp2_pp2_dp2_z3_tied.jsonl" derived \
  "$WORK/tp2_pp2_dp2_z3_tied.serial/step-00000005.h5"
check weights "$WORK/tp2_pp2_dp2_z3_tied.serial/step-00000005.h5" \
  "$WORK/tp2_pp2_dp2_z3_tied/step-00000005.h5" derived "$WORK/tp2_pp2_dp2_z3_tied.serial.jsonl"
echo "ok: tp2_pp2_dp2_z3_tied (losses and weights)"
# The derived bounds can fail: one row of one tensor moved by a tenth of the learning rates'
# sum (what a wrong shard or a lost gradient does to a whole row) and a loss moved by 1e-3.
cp "$WORK/tp2_pp2_dp2_z3_tied/step-00000005.h5" "$WORK/mutated.h5"
$PY - "$WORK/mutated.h5" "$WORK/tp2_pp2_dp2_z3_tied.serial.jsonl" "$WORK/mutated.jsonl" <<'PY'
import h5py, json, sys
lr_sum = sum(json.loads(l)["lr"] for l in open(sys.argv[2]))
with h5py.File(sys.argv[1], "r+") as f:
    w = f["params/layers.1.mlp.fc1.weight"]
    row = w[0, :]
    w[0, :] = row + 0.1 * lr_sum
lines = [json.loads(l) for l in open(sys.argv[2])]
lines[-1]["loss"] *= 1 + 1e-3
open(sys.argv[3], "w").write("".join(json.dumps(l) + "\n" for l in lines))
PY
! $PY "$(dirname "$0")/check_run.py" weights "$WORK/tp2_pp2_dp2_z3_tied.serial/step-00000005.h5" \
  "$WORK/mutated.h5" derived "$WORK/tp2_pp2_dp2_z3_tied.serial.jsonl" >/dev/null 2>&1 ||
  fail "a row moved by 0.1 x the learning rates' sum passed the derived weight bound"
! $PY "$(dirname "$0")/check_run.py" losses "$WORK/tp2_pp2_dp2_z3_tied.serial.jsonl" \
  "$WORK/mutated.jsonl" derived "$WORK/tp2_pp2_dp2_z3_tied.serial/step-00000005.h5" >/dev/null 2>&1 ||
  fail "a loss moved by 1e-3 passed the derived loss bound"
echo "ok: the derived bounds fail a moved row and a moved loss"
