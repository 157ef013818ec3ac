#!/usr/bin/env bash
# The zero-bubble schedules (zb-h1, zb-h2: each layer's backward split into B and W, the W run
# where the schedule places them) equal the serial run, as every layout of
# parallel_equals_serial.sh does: losses over 5 steps and final weights within the bounds of
# test/runtime/tolerance.py, and each category of the measured peak memory per rank within 10% of
# the simulator's forecast. W accumulates each weight's gradients in micro-batch order, as the
# unsplit backward does, so the sums are those of 1F1B. Buffers are printed only on the
# pipelines, for the reason parallel_equals_serial.sh gives (the sends in flight at the peak vary
# from run to run).
source "$(dirname "$0")/common.sh"
source "$(dirname "$0")/tiny_models.sh"
source "$(dirname "$0")/serial_twin.sh"
B8="--global-batch 8 --micro-batch 1"
PRINT_ONLY=buffers case_ pp4_zb_h1 4 GPT8 "$B8" "" "--pp 4 --dp 1 --schedule zb-h1"
PRINT_ONLY=buffers case_ pp4_zb_h2 4 GPT8 "$B8" "" "--pp 4 --dp 1 --schedule zb-h2"
PRINT_ONLY=buffers case_ pp2_tp2_sp_zb_h1 4 LLAMA "$B8" "" "--pp 2 --tp 2 --dp 1 --sequence-parallel --schedule zb-h1"
PRINT_ONLY=buffers case_ pp2_dp2_z1_full_zb_h2 4 GPT "$B8" "--recompute full" "--pp 2 --dp 2 --zero 1 --recompute full --schedule zb-h2"
PRINT_ONLY=buffers case_ pp2_tp2_selective_zb_h1 4 GPT "$B8" "--recompute selective" "--pp 2 --tp 2 --dp 1 --recompute selective --schedule zb-h1"
echo "ok: the zero-bubble schedules equal the serial run"
