# Single-node Slurm for tests: install, start, wait, stop. Sourced by test/slurm/run.sh.
# Everything lives under one temporary directory; every daemon is started here and stopped by its
# PID (never by name). See docs/slurm-notes.md for why each setting is what it is.
# shellcheck shell=bash

SLURM_TEST_CPUS=${SLURM_TEST_CPUS:-8}
_CLUSTER_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
declare -a _DAEMON_PIDS=()   # "name:pid", in start order

clog() { printf '[slurm-test %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

# Installs slurm-wlm and munge when missing. Returns 77 when they cannot be installed at all.
cluster_install() {
  local need=()
  for b in slurmctld slurmd sbatch munged mungekey; do command -v "$b" >/dev/null || need+=("$b"); done
  [ ${#need[@]} -eq 0 ] && return 0
  clog "missing ${need[*]}: installing slurm-wlm and munge"
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo -n"
  if ! $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge; then
    $sudo apt-get update -q || true
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge || return 77
  fi
  for b in slurmctld slurmd sbatch munged mungekey; do command -v "$b" >/dev/null || return 77; done
}

_free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1])'
}

# Starts a daemon in the foreground of a background job, so $! is the daemon itself.
_start_daemon() {
  local name=$1; shift
  "$@" >"$CLUSTER_DIR/log/$name.stdout" 2>&1 </dev/null &
  _DAEMON_PIDS+=("$name:$!")
  clog "started $name (pid $!)"
}

# cluster_start DIR: munged, slurmctld, slurmd; returns when the node is idle.
cluster_start() {
  CLUSTER_DIR=$1
  local d=$CLUSTER_DIR host
  host=$(hostname)
  mkdir -p "$d"/{munge,state,spool,run,log,tmp}
  chmod 755 "$d"
  : >"$d/plugstack.conf"

  # munged refuses folders and keys that are not its own (the socket folder must be world-
  # searchable): give it a private set.
  mungekey -c -k "$d/munge/munge.key" >/dev/null
  chmod 755 "$d/munge"; chmod 600 "$d/munge/munge.key"
  local mu=()
  if [ "$(id -u)" = 0 ] && id munge >/dev/null 2>&1; then
    chown -R munge:munge "$d/munge"
    mu=(setpriv --reuid=munge --regid=munge --init-groups)
  fi
  _start_daemon munged "${mu[@]}" munged -F --socket="$d/munge/munge.socket" \
    --key-file="$d/munge/munge.key" --pid-file="$d/munge/munged.pid" \
    --seed-file="$d/munge/munged.seed" --log-file="$d/munge/munged.log"
  local i
  # Until the socket is there or munged has died: an event, not a time (a loaded machine starts
  # it late); the test's budget bounds the wait.
  while [ ! -S "$d/munge/munge.socket" ] && _daemons_alive; do sleep 0.1; done
  if ! munge -S "$d/munge/munge.socket" -n | unmunge -S "$d/munge/munge.socket" >/dev/null; then
    clog "munged did not come up; its log:"; cat "$d/munge/munged.log" "$d/log/munged.stdout" >&2
    return 1
  fi

  local ctld_port slurmd_port
  ctld_port=$(_free_port); slurmd_port=$(_free_port)
  while [ "$slurmd_port" = "$ctld_port" ]; do slurmd_port=$(_free_port); done
  sed -e "s|@HOST@|$host|g" -e "s|@DIR@|$d|g" -e "s|@CPUS@|$SLURM_TEST_CPUS|g" \
      -e "s|@CTLD_PORT@|$ctld_port|g" -e "s|@SLURMD_PORT@|$slurmd_port|g" \
      "$_CLUSTER_HERE/slurm.conf.in" >"$d/slurm.conf"
  export SLURM_CONF=$d/slurm.conf
  clog "slurm.conf: $SLURM_CONF (node $host, $SLURM_TEST_CPUS CPUs, ports $ctld_port/$slurmd_port)"

  _start_daemon slurmctld slurmctld -D -i -f "$SLURM_CONF"
  _start_daemon slurmd slurmd -D -f "$SLURM_CONF"
  cluster_wait_idle "${SLURM_TEST_START_S:-600}"
}

cluster_wait_idle() {
  local timeout=$1 t0=$SECONDS state=""
  while [ $((SECONDS - t0)) -lt "$timeout" ]; do
    state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1)
    [ "$state" = idle ] && { clog "node idle after $((SECONDS - t0)) s"; return 0; }
    _daemons_alive || { clog "a daemon died"; cluster_dump_logs; return 1; }
    sleep 1
  done
  clog "node not idle after ${timeout} s (state '${state}')"
  sinfo -N -l >&2 || true
  cluster_dump_logs
  return 1
}

_daemons_alive() {
  local e
  for e in "${_DAEMON_PIDS[@]}"; do kill -0 "${e#*:}" 2>/dev/null || return 1; done
}

cluster_dump_logs() {
  local f
  for f in "$CLUSTER_DIR"/log/*; do
    [ -s "$f" ] || continue
    echo "---- $f (last 25 lines)" >&2
    tail -n 25 "$f" >&2
  done
}

# Cancels whatever is left, then stops the daemons in reverse order, by PID.
cluster_stop() {
  [ -n "${CLUSTER_DIR:-}" ] || return 0
  local i me
  me=$(id -un)
  if [ -n "${SLURM_CONF:-}" ] && [ ${#_DAEMON_PIDS[@]} -gt 0 ] && _daemons_alive; then
    # A plain cancel (TERM, then KILL after KillWait): a cancelled job is never requeued.
    scancel --user="$me" 2>/dev/null || true
    for i in $(seq 20); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      [ $((i % 5)) = 0 ] && { scancel --user="$me" 2>/dev/null || true; }
      sleep 1
    done
    # Still there: kill the jobs' processes by PID (slurmd's list of its job steps).
    local pids
    pids=$(scontrol listpids 2>/dev/null | awk 'NR > 1 && $1 ~ /^[0-9]+$/ { print $1 }')
    if [ -n "$pids" ]; then
      clog "job processes still running after the cancel: SIGKILL to the PIDs of slurmd's job steps"
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
    fi
  fi
  local k e name pid
  for ((k = ${#_DAEMON_PIDS[@]} - 1; k >= 0; k--)); do
    e=${_DAEMON_PIDS[k]}; name=${e%%:*}; pid=${e#*:}
    kill -0 "$pid" 2>/dev/null || continue
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
      clog "$name (pid $pid) ignored SIGTERM: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
    clog "stopped $name (pid $pid)"
  done
  _DAEMON_PIDS=()
}
