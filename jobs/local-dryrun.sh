#!/usr/bin/env bash
# jobs/dryrun.sbatch without Slurm: search, then simulate, on this machine's cores with
# mpirun --oversubscribe. Same NAME=VALUE settings (see jobs/dryrun.sbatch --help); NP=2 ranks.
#
#   jobs/local-dryrun.sh [MODEL=llama2-7b CLUSTER=dgx-a100-80g NODES=8 GLOBAL_BATCH=512 ...]
#
# Writes plan.json, search.json, search.txt, forecast.json, forecast.h5 and job.log into
# RUN_DIR (default runs/dryrun-DATE).
. "$(dirname "$0")/lib/common.sh"
. "$SG_JOBS_DIR/lib/dryrun.sh"
: "${NP:=2}" "${LAUNCHER:=mpirun}"
export NP LAUNCHER
dryrun_main "$0" "$@"
