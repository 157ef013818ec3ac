# Helpers of the command-line test scripts (sourced): fail, a JSON field, a grep that reads all
# its input, and a command that must exit 2 with one line.
fail() { echo "FAIL: $*" >&2; exit 1; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }
# grep that reads all its input: under pipefail, grep -q may close the pipe before the writer is
# done, and the writer's SIGPIPE would fail the test at random.
has() { grep -e "$1" >/dev/null; }
# bad cmd...: the command exits 2 with one line (printed, for the caller to check its words).
bad() {
  set +e
  out=$("$BIN" "$@" 2>&1)
  rc=$?
  set -e
  [ $rc = 2 ] || fail "$*: exit $rc, expected 2: $out"
  [ "$(echo "$out" | wc -l)" = 1 ] || fail "$*: not one line: $out"
  echo "$out"
}
