# Shared by the runtime tests: a tiny model, the demo text as data, and mpirun as root.
set -euo pipefail
BIN=${STRATAGEM_BIN:?set STRATAGEM_BIN}
PY=${PY:-/usr/bin/python3}
WORK=$(mktemp -d "${TMPDIR:-/tmp}"/stratagem-test.XXXXXX)
trap '[ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"' EXIT
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
export OMP_NUM_THREADS=1
# These are the CPU backend's tests, on GPU machines too.
export STRATAGEM_BACKEND=cpu
TINY=(--layers 2 --hidden 64 --heads 4 --vocab 256 --seq-len 32)
# Any text will do; the GPU machine's image may lack the license files.
TEXT=/usr/share/common-licenses/GPL-3
[ -f "$TEXT" ] || TEXT=$(dirname "${BASH_SOURCE[0]}")/../../README.md
"$BIN" data tokenize "$TEXT" -o "$WORK/data.bin" >/dev/null
fail() { echo "FAIL: $*" >&2; exit 1; }
# why_failed LOG: a failed run's first error lines, then its end. A rank's error line comes
# first; the launcher's teardown (SIGTERM lines of the other ranks, mpirun's notes) follows it
# and would fill a plain tail.
why_failed() {
  grep -E "error|Error|refus|FAIL|non-finite|signal [0-9]|Killed" "$1" | grep -v "SIGTERM: checkpoint at" |
    head -4 || true
  echo "... the end of $1:"
  tail -5 "$1"
}
# losses FILE -> one loss per line, as written (%.9g)
losses() { $PY -c 'import json,sys; [print(json.loads(l)["loss"]) for l in open(sys.argv[1])]' "$1"; }
# expect_failure SUBCOMMAND NEEDLE NP ARGS...: bad input: the command must exit 2 (the
# contract) and print NEEDLE; leaves its output in $out and its exit code in $rc.
expect_failure() {
  local sub=$1 needle=$2 np=$3; shift 3
  set +e
  # shellcheck disable=SC2086  # SUBCOMMAND may be two words ("data tokenize")
  out=$("${MPIRUN[@]}" -np "$np" "$BIN" $sub "$@" 2>&1)
  rc=$?
  set -e
  [ $rc -ne 0 ] || fail "accepted: $sub $*"
  [ $rc -eq 2 ] || fail "exit $rc, not 2 (bad input), for: $sub $*; got: $out"
  grep -q -- "$needle" <<<"$out" || fail "expected '$needle' for: $sub $*; got: $out"
}
# rank_pid LAUNCHER N -> the pid of world rank N among mpirun's children (empty if the launcher
# has ended). Looked for until found: on a loaded machine (a load of 16 on 2 cores) one look
# found none while the rank was training.
rank_pid() {
  local p
  while running "$1"; do
    for p in $(pgrep -P "$1"); do
      if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -x "OMPI_COMM_WORLD_RANK=$2" >/dev/null; then
        echo "$p"
        return 0
      fi
    done
    sleep 0.05
  done
  return 0
}
# running PID: the process exists and is not a zombie (an orphan's zombie may never be reaped
# in a container whose init does not reap).
running() { [ -e "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
# until_gone SECONDS PID: waits, under `timeout`, for the process to end.
until_gone() {
  timeout "$1" bash -c 'while [ -e /proc/$0 ] && ! grep -q "^State:.*Z" /proc/$0/status 2>/dev/null; do sleep 0.05; done' "$2"
}
# ends_within SECONDS PID [LOG]: the process ends within the bound (else it and its children
# are killed and the test fails, showing the processes and the end of LOG).
ends_within() {
  if ! until_gone "$1" "$2"; then
    ps -o pid,stat,wchan:20,args --ppid "$2" -p "$2" >&2 || true
    [ -z "${3:-}" ] || grep -v '^step' "$3" | tail -20 >&2
    pkill -KILL -P "$2" 2>/dev/null || true
    kill -KILL "$2" 2>/dev/null || true
    fail "still running $1 s after the failure"
  fi
}
# gone_within SECONDS PID...: every process has ended within the bound.
gone_within() {
  local s=$1 p; shift
  for p in "$@"; do
    until_gone "$s" "$p" || { kill -KILL "$p"; fail "pid $p still alive after $s s"; }
  done
}
# wait_lines FILE N PID: until FILE has N lines (PID must stay alive meanwhile).
wait_lines() {
  for _ in $(seq 1200); do
    [ -f "$1" ] && [ "$(wc -l <"$1")" -ge "$2" ] && return 0
    running "$3" || fail "the job ended before $1 had $2 lines"
    sleep 0.05
  done
  fail "timed out waiting for $2 lines in $1"
}
