#!/usr/bin/env bash
# jobs/train.sbatch without Slurm: the same flow and NAME=VALUE settings, on this machine with
# mpirun --oversubscribe. Defaults differ for a laptop or CI machine: 4 ranks, CPU backend, the
# cpu-local cluster; RUN_DIR=runs/train-local-DATE (run again with the same RUN_DIR to resume).
#
#   jobs/local-train.sh DATA=data.bin MODEL= MODEL_FLAGS="--layers 2 --hidden 64 --heads 4 \
#       --vocab 256 --seq-len 32" PLAN_FLAGS="--dp 4 --micro-batch 2 --global-batch 8" STEPS=200
#     NP=4  CLUSTER=cpu-local  BACKEND=cpu  (every other name: see jobs/train.sbatch --help)
#
# USR1, TERM or Ctrl-C: every rank checkpoints at the next step boundary and the script exits 0.
. "$(dirname "$0")/lib/common.sh"
. "$SG_JOBS_DIR/lib/train.sh"
: "${NP:=4}" "${CLUSTER:=cpu-local}" "${BACKEND:=cpu}" "${LAUNCHER:=mpirun}"
export NP CLUSTER BACKEND LAUNCHER
train_main "$0" "$@"
