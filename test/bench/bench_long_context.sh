#!/usr/bin/env bash
# Long context (issue 27): the search on Llama 3 8B at 131,072 tokens over 64 H100s, its best
# plan (context parallelism expected) beside the best plan without it (--cp-degrees 1), or the
# line saying that none fits. Wall-clock figures are printed, never asserted.
set -uo pipefail
BIN=${STRATAGEM_BIN:-${BUILD:-build}/stratagem}
args=(--model llama3-8b --seq-len 131072 --cluster dgx-h100 --nodes 8 --global-batch 64 --quiet)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
summary() {  # label, json file, stderr file, exit code, seconds
  python3 - "$@" <<'PY'
import json, sys
label, out, err, rc, secs = sys.argv[1:]
if rc != "0":
    line = open(err).read().strip().splitlines()
    print(f"  {label:<22} none fits ({secs} s): {line[-1] if line else 'exit ' + rc}")
    sys.exit(0)
j = json.load(open(out))
b = j["best"]
print(f"  {label:<22} {b['tokens_per_s']:9.0f} tokens/s  {b['peak_memory_bytes'] / 2**30:6.2f} GiB"
      f"  ({secs} s)  {b['description']}")
PY
}
echo "search: ${args[*]}"
for run in "best:" "best with cp = 1:--cp-degrees 1"; do
  label=${run%%:*}; extra=${run#*:}
  start=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$BIN" search "${args[@]}" $extra --json >"$work/out" 2>"$work/err"; rc=$?
  secs=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" \
         "$start" "$(date +%s.%N)")
  summary "$label" "$work/out" "$work/err" "$rc" "$secs"
done
