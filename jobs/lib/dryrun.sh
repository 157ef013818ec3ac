# The dry-run flow shared by jobs/dryrun.sbatch and jobs/local-dryrun.sh: search, then simulate,
# then the HTML report.
# shellcheck shell=bash

# dryrun_main SCRIPT "$@"
dryrun_main() {
  SG_SCRIPT=$1; shift
  sg_init dryrun "$SG_SCRIPT" "MODEL MODEL_FLAGS CLUSTER NODES GLOBAL_BATCH MEMORY_BUDGET_GIB
    SEARCH_FLAGS PLAN SIM_FLAGS RUN_DIR NP STRATAGEM_BIN LAUNCHER" "$@"
  : "${MODEL=llama2-7b}" "${CLUSTER:=dgx-a100-80g}" "${NODES:=8}" "${GLOBAL_BATCH:=512}"
  : "${MEMORY_BUDGET_GIB:=}" "${SEARCH_FLAGS:=}" "${PLAN:=}" "${SIM_FLAGS:=}" "${NP:=0}"
  BIN=$(sg_bin)
  sg_run_dir "runs/dryrun-${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)}"
  sg_log "model ${MODEL:-inline} ${MODEL_FLAGS:-}; $NODES x $CLUSTER; global batch $GLOBAL_BATCH;" \
         "memory budget ${MEMORY_BUDGET_GIB:-(GPU memory)} GiB; run dir $RUN_DIR"
  sg_record MODEL MODEL_FLAGS CLUSTER NODES GLOBAL_BATCH MEMORY_BUDGET_GIB SEARCH_FLAGS PLAN \
    SIM_FLAGS BIN SLURM_NTASKS
  sg_model_args
  [[ $GLOBAL_BATCH =~ ^[1-9][0-9]*$ ]] || sg_die 2 "GLOBAL_BATCH must be a positive integer (got '$GLOBAL_BATCH')"
  [ -z "$PLAN" ] || [ -f "$PLAN" ] || sg_die 2 "PLAN=$PLAN: no such file"
  # A bad model name fails here, on one process, before any rank starts (search and simulate
  # check everything again, inline shape flags included).
  local rc=0 out
  if [ -n "$MODEL" ] && [ -z "${MODEL_FLAGS:-}" ]; then
    out=$(OMPI_MCA_ess_singleton_isolated=1 "$BIN" model show "$MODEL" 2>&1) || rc=$?
    [ "$rc" = 0 ] || { printf '%s\n' "$out" >&2; sg_die "$rc" "bad MODEL=$MODEL (stratagem model show, exit $rc)"; }
  fi
  [ -n "$PLAN" ] || sg_need_subcommand search
  sg_need_subcommand simulate
  sg_pick_launcher

  if [ -n "$PLAN" ]; then
    # A given plan: simulate it only (checked against model, cluster and NODES by simulate).
    sg_log "PLAN=$PLAN given: no search"
    [ "$PLAN" -ef "$RUN_DIR/plan.json" ] || cp "$PLAN" "$RUN_DIR/plan.json"
  else
    local search=(search "${MODEL_ARGS[@]}" "${CLUSTER_ARGS[@]}" --global-batch "$GLOBAL_BATCH")
    [ -n "$MEMORY_BUDGET_GIB" ] && search+=(--memory-budget-gib "$MEMORY_BUDGET_GIB")
    # shellcheck disable=SC2206
    search+=($SEARCH_FLAGS)
    sg_launch "$NP" "$BIN" "${search[@]}" -o "$RUN_DIR/plan.json" --json >"$RUN_DIR/search.json" || rc=$?
    if [ "$rc" != 0 ]; then sg_explain_exit "$rc" "search"; exit "$rc"; fi
    # The human-readable table (rank 0 prints it), from the same search.
    sg_launch "$NP" "$BIN" "${search[@]}" --quiet >"$RUN_DIR/search.txt" || rc=$?
    if [ "$rc" != 0 ]; then sg_explain_exit "$rc" "search (table)"; exit "$rc"; fi
    sed -n '1,25p' "$RUN_DIR/search.txt"
  fi

  # shellcheck disable=SC2086
  sg_launch "$NP" "$BIN" simulate "${MODEL_ARGS[@]}" "${CLUSTER_ARGS[@]}" --plan "$RUN_DIR/plan.json" \
    --json --trace "$RUN_DIR/forecast.h5" $SIM_FLAGS >"$RUN_DIR/forecast.json" || rc=$?
  if [ "$rc" != 0 ]; then sg_explain_exit "$rc" "simulate"; exit "$rc"; fi
  local t
  t=$(sed -n 's/^ *"iteration_time_s": *\([^,]*\).*/\1/p' "$RUN_DIR/forecast.json" | head -1)
  sg_log "forecast: ${t:-?} s per iteration; outputs in $RUN_DIR"

  # One HTML page beside the plan and the forecast: timeline, memory, stage balance, and the
  # search front when a search ran. A serial step: one process reads the trace.
  sg_need_subcommand report
  local report=(report --trace "$RUN_DIR/forecast.h5" -o "$RUN_DIR/report.html")
  [ -n "$PLAN" ] || report+=(--search "$RUN_DIR/search.json")
  OMPI_MCA_ess_singleton_isolated=1 "$BIN" "${report[@]}" >&2 || rc=$?
  if [ "$rc" != 0 ]; then sg_explain_exit "$rc" "report"; exit "$rc"; fi
  sg_log "report: $RUN_DIR/report.html"
}
