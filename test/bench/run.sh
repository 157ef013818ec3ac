#!/usr/bin/env bash
# `make bench`: every benchmark prints figures measured side by side in this one run.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
status=0
for b in "$BUILD"/bench_*; do
  [ -x "$b" ] || continue
  printf '\n=== %s\n' "$(basename "$b")"
  "$b" || status=1
done
for s in test/bench/bench_*.sh; do
  [ -f "$s" ] || continue
  printf '\n=== %s\n' "$(basename "$s")"
  BUILD=$BUILD bash "$s" || status=1
done
exit $status
