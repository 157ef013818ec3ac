#!/usr/bin/env bash
# `stratagem report` of a 1,024-rank trace (GPT-3 175B, pp 16 x tp 8 x dp 8, global batch 1536,
# 128 DGX A100 nodes): the page's size (goal: under 5 MB), the time to write it, and the time it
# takes headless chromium to open it (goal: under 3 s), measured two ways side by side: the
# page's own clock (navigation start to the timeline drawn, #report-ready's data-ms) and the
# wall time of `chromium --dump-dom` against the same for an empty page.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${STRATAGEM_BIN:-${BUILD:-build}/stratagem}
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
WORK=$(mktemp -d /tmp/stratagem-bench-report.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
now() { date +%s.%N; }
t0=$(now)
"$BIN" simulate --model gpt3-175b --cluster dgx-a100-80g --nodes 128 --tp 8 --pp 16 --dp 8 \
  --micro-batch 1 --global-batch 1536 --recompute full --trace "$WORK/t.h5" >/dev/null
t1=$(now)
"$BIN" report --trace "$WORK/t.h5" -o "$WORK/r.html" >/dev/null
t2=$(now)
bytes=$(stat -c %s "$WORK/r.html")
h5=$(stat -c %s "$WORK/t.h5")
printf 'trace: 1024 ranks, %.0f MB HDF5, simulated in %.1f s\n' "$(echo "$h5 / 1000000" | bc -l)" "$(echo "$t1 - $t0" | bc -l)"
printf 'report: %.2f MB (goal < 5 MB), written in %.1f s\n' "$(echo "$bytes / 1000000" | bc -l)" "$(echo "$t2 - $t1" | bc -l)"
if [ -z "$CHROMIUM" ]; then
  echo "chromium not installed: open time not measured (make deps installs it)"
  exit 0
fi
echo '<!DOCTYPE html><html><body><p>empty</p></body></html>' > "$WORK/empty.html"
FLAGS=(--headless --no-sandbox --disable-gpu --user-data-dir="$WORK/profile" --window-size=1400,1500)
shot() {  # file -> wall seconds of a screenshot (load, script, layout and paint)
  local s e
  s=$(now)
  timeout 120 "$CHROMIUM" "${FLAGS[@]}" --screenshot="$WORK/shot.png" "file://$1" >/dev/null 2>&1
  e=$(now)
  echo "$e - $s" | bc -l
}
shot "$WORK/empty.html" >/dev/null  # warm the profile and the page cache
for i in 1 2 3; do
  empty=$(shot "$WORK/empty.html")
  page=$(shot "$WORK/r.html")
  timeout 120 "$CHROMIUM" "${FLAGS[@]}" --dump-dom "file://$WORK/r.html" >"$WORK/dom" 2>/dev/null
  ms=$(grep -o 'id="report-ready"[^>]*' "$WORK/dom" | sed -n 's/.*data-ms="\([0-9]*\)".*/\1/p')
  printf 'open %d: page clock %s ms to the timeline drawn; screenshot wall %.2f s, empty page %.2f s, difference %.2f s (goal < 3 s)\n' \
    "$i" "${ms:-?}" "$page" "$empty" "$(echo "$page - $empty" | bc -l)"
done
