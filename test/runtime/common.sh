# Shared by the runtime tests: a tiny model, the demo text as data, and mpirun as root.
set -euo pipefail
BIN=${STRATAGEM_BIN:?set STRATAGEM_BIN}
PY=/usr/bin/python3
WORK=$(mktemp -d /tmp/stratagem-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
export OMP_NUM_THREADS=1
TINY=(--layers 2 --hidden 64 --heads 4 --vocab 256 --seq-len 32)
"$BIN" data tokenize /usr/share/common-licenses/GPL-3 -o "$WORK/data.bin" >/dev/null
fail() { echo "FAIL: $*" >&2; exit 1; }
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
  echo "$out" | grep -q -- "$needle" || fail "expected '$needle' for: $sub $*; got: $out"
}
