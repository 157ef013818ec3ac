#!/usr/bin/env bash
# Golden forecasts: `estimate --json` and `simulate --json` of every case in cases.txt must equal
# out/<case>.{estimate,simulate}.json byte for byte. A changed forecast shows up here in review;
# re-record on purpose with `check.sh --record` and say why in the commit.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
BIN=${STRATAGEM_BIN:?set STRATAGEM_BIN}
record=0; [ "${1:-}" = --record ] && record=1
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
failed=0; passed=0
while IFS='|' read -r name args; do
  name=$(echo "$name" | xargs); [ -z "$name" ] || [ "${name#\#}" != "$name" ] && continue
  args=${args//@plans\//$here/plans/}
  for cmd in estimate simulate; do
    out="$work/$name.$cmd.json"
    # shellcheck disable=SC2086
    "$BIN" $cmd $args --json >"$out" 2>"$work/err"; rc=$?
    if [ $rc != 0 ]; then
      echo "FAIL $name $cmd: exit $rc: $(head -c 300 "$work/err")"; failed=$((failed + 1)); continue
    fi
    gold="$here/out/$name.$cmd.json"
    if [ $record = 1 ]; then cp "$out" "$gold"; passed=$((passed + 1)); continue; fi
    if cmp -s "$out" "$gold"; then passed=$((passed + 1)); else
      echo "FAIL $name $cmd: differs from $gold:"; diff "$gold" "$out" | head -20
      failed=$((failed + 1))
    fi
  done
done <"$here/cases.txt"
echo "golden forecasts: $passed passed, $failed failed"
[ $failed = 0 ]
