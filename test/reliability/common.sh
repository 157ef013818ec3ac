# Shared by the reliability tests: the runtime tests' helpers (tiny model, data, mpirun as root,
# expect_failure), plus assertions on one command's exit code and line.
# shellcheck source=test/runtime/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../runtime/common.sh"
TRAIN=("$BIN" train "${TINY[@]}")
# STRATAGEM_KEEP_GOING=1: every failing case is reported (as "FAIL: ...") and the script goes on,
# to show which of its reproducers an older binary fails (STRATAGEM_BIN=old/stratagem). Not for
# CI: the script's status then says nothing.
if [ "${STRATAGEM_KEEP_GOING:-0}" = 1 ]; then
  fail() { echo "FAIL: $*" >&2; }
fi
# run CMD...: runs it, keeping its exit code in $rc and its output (both streams) in $out.
run() {
  set +e
  out=$("$@" 2>&1)
  rc=$?
  set -e
}
# expect_rc CODE NEEDLE CMD...: CMD exits CODE and prints NEEDLE (a fixed string).
expect_rc() {
  local code=$1 needle=$2; shift 2
  run "$@"
  [ "$rc" = "$code" ] || { fail "exit $rc, not $code, for: $*; got: $out"; return 0; }
  grep -qF -- "$needle" <<<"$out" || { fail "expected '$needle' for: $*; got: $out"; return 0; }
  echo "ok: exit $code: $needle"
}
