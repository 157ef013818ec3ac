# The training flow shared by jobs/train.sbatch and jobs/local-train.sh.
# shellcheck shell=bash

# Newest step recorded in a log.jsonl (the largest "step" value; empty when there is none).
train_last_step() {
  [ -f "$1" ] || return 0
  sed -n 's/.*"step": *\([0-9][0-9]*\).*/\1/p' "$1" | sort -n | tail -1
}

# train_main SCRIPT "$@"
train_main() {
  SG_SCRIPT=$1; shift
  sg_init train "$SG_SCRIPT" "MODEL MODEL_FLAGS CLUSTER NODES PLAN PLAN_FLAGS DATA STEPS CKPT_EVERY
    SEED BACKEND TRAIN_FLAGS TRACE RUN_DIR RESUME MAX_RESTARTS NP STRATAGEM_BIN LAUNCHER
    SIGNAL_LEAD_S" "$@"
  : "${MODEL=llama2-7b}" "${CLUSTER:=dgx-a100-80g}" "${PLAN:=}" "${DATA:=}" "${STEPS:=1000}"
  : "${CKPT_EVERY:=100}" "${SEED:=}" "${BACKEND:=cuda}" "${TRAIN_FLAGS:=}" "${RESUME:=auto}"
  : "${MAX_RESTARTS:=20}" "${NP:=0}" "${TRACE:=1}"
  if [ -z "$PLAN" ] && [ -z "${PLAN_FLAGS:-}" ]; then
    PLAN_FLAGS="--tp 8 --pp 1 --dp 2 --micro-batch 1 --global-batch 256 --zero 1 --recompute selective"
  fi
  # Under Slurm the node count is the allocation's, and the plan must use whole nodes (one rank
  # per GPU). Without Slurm NODES is optional: stratagem then sizes the node to the world.
  if sg_in_slurm; then
    local alloc=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
    [ -z "${NODES:-}" ] || [ "$NODES" = "$alloc" ] ||
      sg_log "warning: NODES=$NODES ignored: the allocation has $alloc node(s)"
    NODES=$alloc
  fi
  BIN=$(sg_bin)
  sg_run_dir "runs/train-${SLURM_JOB_ID:-local-$(date +%Y%m%d-%H%M%S)}"
  local ckpt=$RUN_DIR/ckpt
  mkdir -p "$ckpt"
  sg_log "start ${SLURM_RESTART_COUNT:+(restart $SLURM_RESTART_COUNT) }on $(hostname):" \
         "job ${SLURM_JOB_ID:-local}, run dir $RUN_DIR"
  sg_record MODEL MODEL_FLAGS CLUSTER NODES PLAN PLAN_FLAGS DATA STEPS CKPT_EVERY SEED BACKEND \
    TRAIN_FLAGS RESUME LAUNCHER NP BIN SLURM_NTASKS SLURM_JOB_NODELIST
  sg_model_args

  # Bad input fails here, before any rank starts.
  local v
  for v in STEPS CKPT_EVERY MAX_RESTARTS; do
    [[ ${!v} =~ ^[0-9]+$ ]] || sg_die 2 "$v must be a non-negative integer (got '${!v}')"
  done
  [ "$STEPS" -gt 0 ] || sg_die 2 "STEPS must be at least 1"
  case $BACKEND in cpu|cuda) ;; *) sg_die 2 "BACKEND must be cpu or cuda (got '$BACKEND')" ;; esac
  [ -n "$DATA" ] || sg_die 2 "give DATA=FILE (a token file: stratagem data tokenize IN.txt -o DATA.bin)"
  [ -f "$DATA" ] || sg_die 2 "DATA=$DATA: no such file"
  DATA=$(cd "$(dirname "$DATA")" && pwd)/$(basename "$DATA")
  local plan_args=()
  if [ -n "$PLAN" ]; then
    [ -z "${PLAN_FLAGS:-}" ] || sg_die 2 "give PLAN=FILE or PLAN_FLAGS, not both"
    [ -f "$PLAN" ] || sg_die 2 "PLAN=$PLAN: no such file"
    plan_args=(--plan "$PLAN")
  else
    # shellcheck disable=SC2206
    plan_args=($PLAN_FLAGS)
  fi
  sg_need_subcommand train
  sg_pick_launcher
  local tasks
  tasks=$(sg_tasks "$NP")
  # With a known node count, plan check validates model, cluster, plan and task count on one
  # process before the launch (stratagem train checks the same again on every rank).
  if [ -n "${NODES:-}" ]; then sg_preflight "$tasks" "${plan_args[@]}"; fi

  local resume=()
  local have_ckpt=""
  compgen -G "$ckpt/step-*.h5" >/dev/null && have_ckpt=$(cd "$ckpt" && ls step-*.h5 | sort | tail -1)
  case $RESUME in
    auto) [ -n "$have_ckpt" ] && resume=(--resume) ;;
    1|yes|true)
      [ -n "$have_ckpt" ] || sg_die 2 "RESUME=1 but $ckpt has no checkpoint (step-*.h5): nothing to resume from"
      resume=(--resume) ;;
    0|no|false)
      [ -z "$have_ckpt" ] || sg_die 2 "RESUME=0 but $ckpt already holds checkpoints ($have_ckpt): use a fresh RUN_DIR" ;;
    *) sg_die 2 "RESUME must be auto, 1 or 0 (got '$RESUME')" ;;
  esac
  if [ ${#resume[@]} -gt 0 ]; then
    sg_log "resuming from the newest complete checkpoint in $ckpt (newest file: $have_ckpt)"
  else
    sg_log "starting from step 0"
  fi

  local cmd=(train "${MODEL_ARGS[@]}" "${CLUSTER_ARGS[@]}" "${plan_args[@]}" --data "$DATA"
             --steps "$STEPS" --ckpt-dir "$ckpt" --ckpt-every "$CKPT_EVERY" "${resume[@]}"
             --log-json "$RUN_DIR/log.jsonl" --backend "$BACKEND")
  [ "$TRACE" = 0 ] || cmd+=(--trace "$RUN_DIR/trace.h5")
  [ -n "$SEED" ] && cmd+=(--seed "$SEED")
  # shellcheck disable=SC2206
  cmd+=($TRAIN_FLAGS)
  local rc=0
  sg_launch "$tasks" "$BIN" "${cmd[@]}" || rc=$?

  local last
  last=$(train_last_step "$RUN_DIR/log.jsonl")
  if [ "$rc" != 0 ]; then
    sg_explain_exit "$rc" "stratagem train"
    sg_log "not requeueing (exit $rc); last logged step ${last:-none}"
    exit "$rc"
  fi
  if [ -n "$last" ] && [ "$last" -ge "$STEPS" ]; then
    sg_log "finished: $STEPS steps; outputs in $RUN_DIR"
    exit 0
  fi
  # Exit 0 before --steps: the ranks were told to stop (USR1/TERM) and saved a checkpoint.
  sg_log "stopped at step ${last:-0} of $STEPS${SG_SIGNALLED:+ after SIG$SG_SIGNALLED}; newest checkpoint:" \
         "$(cd "$ckpt" && ls step-*.h5 2>/dev/null | sort | tail -1)"
  if ! sg_in_slurm; then
    sg_log "to continue, run again with RUN_DIR=$RUN_DIR"
    exit 0
  fi
  # TERM (or INT) to this shell means Slurm is ending the job (scancel, time limit, shutdown):
  # the checkpoint is kept for a later resubmission, but the job is not requeued. The
  # time-limit warning (--signal=USR1@120) and `scancel --signal=USR1` reach only the ranks.
  local state
  state=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -1)
  if [ "$SG_SIGNALLED" = TERM ] || [ "$SG_SIGNALLED" = INT ] || { [ -n "$state" ] && [ "$state" != RUNNING ]; }; then
    sg_log "the job is ending (SIG${SG_SIGNALLED:-?} to the batch shell, state ${state:-?}): not requeueing;" \
           "resubmit with RUN_DIR=$RUN_DIR to resume"
    exit 0
  fi
  if [ "${SLURM_RESTART_COUNT:-0}" -ge "$MAX_RESTARTS" ]; then
    sg_die 1 "already restarted $SLURM_RESTART_COUNT times (MAX_RESTARTS=$MAX_RESTARTS): not requeueing; resubmit with RUN_DIR=$RUN_DIR"
  fi
  sg_log "requeueing job $SLURM_JOB_ID (restart $(( ${SLURM_RESTART_COUNT:-0} + 1 ))); it resumes in $RUN_DIR"
  scontrol requeue "$SLURM_JOB_ID" ||
    sg_die 1 "scontrol requeue $SLURM_JOB_ID failed: resubmit with RUN_DIR=$RUN_DIR to resume"
  exit 0
}
