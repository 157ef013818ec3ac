# jobs/lib/common.sh: what every stratagem job script shares (sourced, not run).
#   sg_init NAME $0 VARS "$@"  strict mode, signal traps, NAME=VALUE arguments, --help
#   sg_log / sg_die      timestamped lines in the job log; sg_die CODE MSG exits with CODE
#   sg_bin               the stratagem binary (STRATAGEM_BIN, else build/stratagem, else PATH)
#   sg_run_dir DEFAULT   create RUN_DIR (absolute), link the Slurm log into it
#   sg_model_args ...    --model/inline shape flags and --cluster/--nodes as arrays
#   sg_preflight         plan check: the plan is valid and its world size matches the tasks
#   sg_launch NP CMD...  run CMD on NP MPI ranks (0: all tasks of the allocation) with srun
#                        --mpi=pmix or mpirun, forwarding USR1/TERM/INT as USR1 (stratagem's
#                        "checkpoint at the next step boundary and exit 0")
# Exit codes follow stratagem's: 0 ok, 1 failure, 2 bad input, 3 no plan fits.
# shellcheck shell=bash

SG_JOBS_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SG_REPO=$(dirname "$SG_JOBS_DIR")
SG_NAME=job
SG_SCRIPT=""
SG_VARS=""
SG_CHILD=""        # PID of the running launcher (srun or mpirun)
SG_SIGNALLED=""    # last signal this shell received (lib/train.sh reports it)
SG_TRAPPED=0
SG_LOG_FILE=""

# Log lines go to stderr: stdout may be a result file (search.json, forecast.json) while a trap or
# the launcher logs. (Slurm writes both into the job log.)
sg_log() { printf '[%s %s] %s\n' "$SG_NAME" "$(date '+%F %T')" "$*" >&2; }
sg_die() {
  local code=$1; shift
  printf '[%s %s] error: %s\n' "$SG_NAME" "$(date '+%F %T')" "$*" >&2
  exit "$code"
}

# Prints the comment block at the top of the calling script (its documentation).
sg_usage() {
  sed -n '2,/^[^#]/{/^#SBATCH/d;/^#/!d;s/^# \{0,1\}//;p}' "$1"
}

# sg_init NAME SCRIPT "VAR ..." "$@": strict mode, traps, and the NAME=VALUE arguments, each
# exported; only the listed variables are accepted. SCRIPT ($0) holds the --help text.
sg_init() {
  SG_NAME=$1 SG_SCRIPT=$2 SG_VARS=$3
  shift 3
  set -euo pipefail
  trap '_sg_signal USR1' USR1
  trap '_sg_signal TERM' TERM
  trap '_sg_signal INT' INT
  local a name vars
  vars=" $(printf '%s' "$SG_VARS" | tr -s ' \n\t' '   ') "
  for a in "$@"; do
    case $a in
      -h|--help) sg_usage "$SG_SCRIPT"; exit 0 ;;
      *=*)
        name=${a%%=*}
        [[ $vars == *" $name "* ]] ||
          sg_die 2 "unknown argument '$a' (accepted:$vars; see --help)"
        # shellcheck disable=SC2163  # exports NAME=VALUE as given
        export "$a" ;;
      *) sg_die 2 "arguments are NAME=VALUE (got '$a'; see --help)" ;;
    esac
  done
}

# The batch shell must survive USR1/TERM (Slurm sends them to steps; `scancel --full` and
# `--signal=B:...` also to this shell). Every one becomes USR1 for the ranks: stratagem
# checkpoints at the next step boundary on all ranks and exits 0. (mpirun answers TERM by
# killing its ranks at once, so TERM itself is never forwarded.)
_sg_signal() {
  # shellcheck disable=SC2034  # read by lib/train.sh
  SG_SIGNALLED=$1
  SG_TRAPPED=1
  if [ -n "$SG_CHILD" ] && kill -0 "$SG_CHILD" 2>/dev/null; then
    sg_log "received SIG$1: asking the ranks to checkpoint at the next step boundary (USR1)"
    kill -USR1 "$SG_CHILD" 2>/dev/null || true
  else
    sg_log "received SIG$1 with no ranks running"
    [ "$1" = USR1 ] || exit 143
  fi
}

sg_bin() {
  if [ -n "${STRATAGEM_BIN:-}" ]; then
    if [ ! -f "$STRATAGEM_BIN" ] || [ ! -x "$STRATAGEM_BIN" ]; then
      sg_die 1 "STRATAGEM_BIN=$STRATAGEM_BIN is not an executable"
    fi
    echo "$(cd "$(dirname "$STRATAGEM_BIN")" && pwd)/$(basename "$STRATAGEM_BIN")"
  elif [ -x "$SG_REPO/build/stratagem" ]; then
    echo "$SG_REPO/build/stratagem"
  elif command -v stratagem >/dev/null; then
    command -v stratagem
  else
    sg_die 1 "no stratagem binary: build it (make build) or set STRATAGEM_BIN"
  fi
}

# Fails (exit 2) unless the binary has subcommand $1, e.g. "search" or "data tokenize".
sg_need_subcommand() {
  "$BIN" --help 2>/dev/null | grep -q "^  $1 " ||
    sg_die 2 "$BIN has no '$1' subcommand yet (stratagem --help lists what this build has)"
}

sg_in_slurm() { [ -n "${SLURM_JOB_ID:-}" ]; }

# sg_run_dir DEFAULT: RUN_DIR (default DEFAULT), created and made absolute.
sg_run_dir() {
  RUN_DIR=${RUN_DIR:-$1}
  mkdir -p "$RUN_DIR" || sg_die 2 "cannot create RUN_DIR=$RUN_DIR"
  RUN_DIR=$(cd "$RUN_DIR" && pwd)
  export RUN_DIR
  if sg_in_slurm; then
    # The Slurm log (with --open-mode=append: every restart) is visible from the run folder.
    local out
    out=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *StdOut=//p' | head -1)
    [ -n "$out" ] && [ -f "$out" ] && ln -sfn "$out" "$RUN_DIR/slurm-$SLURM_JOB_ID.out"
  else
    # Local runs: everything this script and the ranks print also goes to RUN_DIR/job.log.
    SG_LOG_FILE=$RUN_DIR/job.log
    exec > >(tee -a "$SG_LOG_FILE") 2>&1
  fi
}

# Records what this start of the job ran with (appended: one block per start).
sg_record() {
  {
    echo "# $(date '+%F %T') $SG_NAME job=${SLURM_JOB_ID:-local} restart=${SLURM_RESTART_COUNT:-0}"
    local v
    for v in "$@"; do printf '%s=%q\n' "$v" "${!v-}"; done
  } >>"$RUN_DIR/run.env"
}

# Model and cluster flags as arrays: MODEL (name or JSON file; may be empty when MODEL_FLAGS
# holds inline shape flags), MODEL_FLAGS, CLUSTER, NODES.
sg_model_args() {
  MODEL_ARGS=()
  [ -n "${MODEL:-}" ] && MODEL_ARGS+=(--model "$MODEL")
  # shellcheck disable=SC2206
  [ -n "${MODEL_FLAGS:-}" ] && MODEL_ARGS+=($MODEL_FLAGS)
  [ ${#MODEL_ARGS[@]} -gt 0 ] || sg_die 2 "give MODEL=NAME|FILE.json or inline MODEL_FLAGS"
  [ -n "${CLUSTER:-}" ] || sg_die 2 "give CLUSTER=NAME|FILE.json"
  CLUSTER_ARGS=(--cluster "$CLUSTER")
  if [ -n "${NODES:-}" ]; then
    [[ $NODES =~ ^[1-9][0-9]*$ ]] || sg_die 2 "NODES must be a positive integer (got '$NODES')"
    CLUSTER_ARGS+=(--nodes "$NODES")
  fi
}

# sg_preflight TASKS PLAN_ARGS...: `stratagem plan check` on one process, before any compute.
# Fails with stratagem's own exit code on a bad model, cluster or plan, and with 2 when the plan
# needs another number of ranks than TASKS (0: do not compare). Sets PLAN_WORLD.
sg_preflight() {
  local tasks=$1; shift
  local out rc=0
  out=$(OMPI_MCA_ess_singleton_isolated=1 "$BIN" plan check "${MODEL_ARGS[@]}" \
        "${CLUSTER_ARGS[@]}" "$@" --json 2>&1) || rc=$?
  if [ "$rc" != 0 ]; then
    printf '%s\n' "$out" >&2
    sg_die "$rc" "the model, cluster or plan was rejected (stratagem plan check, exit $rc)"
  fi
  PLAN_WORLD=$(printf '%s\n' "$out" | sed -n 's/^ *"world_size": *\([0-9]*\).*/\1/p' | head -1)
  [ -n "$PLAN_WORLD" ] || sg_die 1 "cannot read world_size from stratagem plan check --json"
  if [ "$tasks" != 0 ] && [ "$tasks" != "$PLAN_WORLD" ]; then
    sg_die 2 "the plan needs $PLAN_WORLD ranks (one per GPU) but this job has $tasks tasks: submit with --nodes/--ntasks-per-node to match, or change NODES or the plan"
  fi
}

# Number of MPI tasks the launch will have: NP when given, else the allocation's.
sg_tasks() {
  if [ "${1:-0}" != 0 ]; then echo "$1"
  elif sg_in_slurm; then echo "${SLURM_NTASKS:-${SLURM_NPROCS:-1}}"
  else echo 1
  fi
}

# Picks SG_LAUNCHER: LAUNCHER=srun|mpirun, or auto (srun --mpi=pmix inside an allocation whose
# Slurm has the pmix plugin, mpirun otherwise).
sg_pick_launcher() {
  case ${LAUNCHER:-auto} in
    srun)
      sg_in_slurm || sg_die 2 "LAUNCHER=srun needs a Slurm allocation"
      SG_LAUNCHER=srun ;;
    mpirun) SG_LAUNCHER=mpirun ;;
    auto)
      if sg_in_slurm && command -v srun >/dev/null && srun --mpi=list 2>&1 | grep -qw pmix; then
        SG_LAUNCHER=srun
      else
        SG_LAUNCHER=mpirun
        sg_in_slurm && sg_log "this Slurm has no PMIx plugin (srun --mpi=list): using mpirun"
      fi ;;
    *) sg_die 2 "LAUNCHER must be auto, srun or mpirun (got '$LAUNCHER')" ;;
  esac
  if [ "$SG_LAUNCHER" = mpirun ]; then
    command -v mpirun >/dev/null || sg_die 1 "mpirun not found (install Open MPI or use LAUNCHER=srun)"
  fi
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-${SLURM_CPUS_PER_TASK:-1}}
}

# SG_MPI: the launcher prefix for NP ranks (0: every task of the allocation).
_sg_mpi_prefix() {
  local np=$1
  if [ "$SG_LAUNCHER" = srun ]; then
    SG_MPI=(srun --mpi=pmix --kill-on-bad-exit=1)
    # Since Slurm 22.05 srun does not inherit sbatch's --cpus-per-task.
    [ -n "${SLURM_CPUS_PER_TASK:-}" ] && SG_MPI+=(--cpus-per-task="$SLURM_CPUS_PER_TASK")
    [ "$np" != 0 ] && SG_MPI+=(--ntasks="$np")
  else
    SG_MPI=(mpirun)
    [ "$(id -u)" = 0 ] && SG_MPI+=(--allow-run-as-root)
    # Outside Slurm this machine's cores are all we have; inside, the allocation's slots.
    sg_in_slurm || SG_MPI+=(--oversubscribe --bind-to none)
    [ "$np" != 0 ] && SG_MPI+=(-np "$np")
    SG_MPI+=(-x OMP_NUM_THREADS)
    # stratagem fails when its world differs from SLURM_NTASKS (its guard against srun starting
    # singletons); an mpirun world is never that, so a deliberately smaller one is fine.
    if sg_in_slurm && [ "$np" != 0 ] && [ "$np" != "${SLURM_NTASKS:-$np}" ]; then
      SG_MPI+=(-x STRATAGEM_SKIP_SLURM_CHECK=1)
    fi
  fi
  # shellcheck disable=SC2206  # MPI_EXTRA_ARGS: more launcher flags, split on spaces
  SG_MPI+=(${MPI_EXTRA_ARGS:-})
}

# mpirun inside Slurm is not a job step, so `--signal=USR1@120` never reaches it: send USR1 to
# this shell (which forwards it) SIGNAL_LEAD_S seconds before the time limit instead.
_sg_watchdog() {
  SG_WATCHDOG=""
  [ "$SG_LAUNCHER" = mpirun ] && sg_in_slurm || return 0
  local left lead=${SIGNAL_LEAD_S:-120} d=0 h=0 m=0 s=0 t
  left=$(squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null | head -1) || return 0
  t=$left
  [[ $t == *-* ]] && { d=${t%%-*}; t=${t#*-}; }
  IFS=: read -r -a parts <<<"$t"
  case ${#parts[@]} in
    3) h=${parts[0]} m=${parts[1]} s=${parts[2]} ;;
    2) m=${parts[0]} s=${parts[1]} ;;
    *) return 0 ;;  # UNLIMITED, NOT_SET, ...
  esac
  [[ "$d$h$m$s" =~ ^[0-9]+$ ]] || return 0
  local secs=$(( ((10#$d * 24 + 10#$h) * 60 + 10#$m) * 60 + 10#$s - lead ))
  [ "$secs" -gt 0 ] || secs=1
  local shell_pid=$$
  ( trap - USR1 TERM INT
    end=$(( $(date +%s) + secs ))
    while [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    kill -USR1 "$shell_pid" ) </dev/null >/dev/null 2>&1 &
  SG_WATCHDOG=$!
  sg_log "time limit in $left: USR1 to the ranks in ${secs}s (mpirun is not a Slurm step)"
}

# sg_launch NP CMD...: runs CMD on NP ranks and returns its exit code (never exits the shell).
sg_launch() {
  local np=$1; shift
  _sg_mpi_prefix "$np"
  sg_log "launch: ${SG_MPI[*]} $*"
  "${SG_MPI[@]}" "$@" </dev/null &
  SG_CHILD=$!
  _sg_watchdog
  local rc prev=""
  while :; do
    SG_TRAPPED=0
    rc=0
    wait "$SG_CHILD" || rc=$?
    # `wait` returns early (>128) when a trapped signal arrives; the launcher is still running.
    if [ "$rc" = 127 ] && [ -n "$prev" ]; then rc=$prev; break; fi
    if [ "$SG_TRAPPED" = 1 ] && [ "$rc" -gt 128 ]; then prev=$rc; continue; fi
    break
  done
  SG_CHILD=""
  [ -n "${SG_WATCHDOG:-}" ] && { kill "$SG_WATCHDOG" 2>/dev/null || true; }
  return "$rc"
}

# sg_explain_exit RC WHAT: one line saying what stratagem's exit code means.
sg_explain_exit() {
  case $1 in
    0) ;;
    2) sg_log "$2: bad input (exit 2); see the message above. Nothing to retry." ;;
    3) sg_log "$2: no plan fits the memory budget (exit 3)" ;;
    *) if [ "$1" -gt 128 ]; then
         sg_log "$2: the ranks were killed by signal $(( $1 - 128 )) ($(kill -l $(( $1 - 128 )) 2>/dev/null || echo '?'))"
       else
         sg_log "$2: failed (exit $1)"
       fi ;;
  esac
}
