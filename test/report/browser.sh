#!/usr/bin/env bash
# Reports rendered in a real browser (Debian's chromium, headless): a simulated GPT-3 175B plan
# (pp 16 x tp 8 x dp 8 on 128 DGX A100 nodes: 1,024 ranks) and a search result. Each page must
# load without a console message, its script must finish (it adds #report-ready to the DOM),
# the screenshot must not be blank, and the SVG must hold one timeline rank, one memory chart
# and one balance row per pipeline stage, and one point per recorded search candidate.
# KEEP_DIR=DIR keeps the screenshots (the README's docs/report-*.png come from here).
set -euo pipefail
BIN=${STRATAGEM_BIN:?set STRATAGEM_BIN}
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
  echo "SKIP: chromium is not installed (make deps installs it: apt-get install chromium)"
  exit 77
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}"/stratagem-browser.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1 SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1798761600}
fail() { echo "FAIL: $*" >&2; exit 1; }

# browse NAME WIDTHxHEIGHT: screenshot and DOM of $WORK/NAME.html, console messages checked.
browse() {
  local name=$1 size=$2
  local flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --enable-logging=stderr
               --v=0 --user-data-dir="$WORK/profile" --window-size="$size")
  # One browser run writes both the screenshot and the DOM after the page's script ran.
  timeout 120 "$CHROMIUM" "${flags[@]}" --screenshot="$WORK/$name.png" --dump-dom \
    "file://$WORK/$name.html" >"$WORK/$name.dom" 2>"$WORK/$name.log" ||
    fail "$name: chromium failed: $(tail -3 "$WORK/$name.log")"
  if grep -h "CONSOLE" "$WORK/$name.log"; then
    fail "$name: the page wrote to the console (above)"
  fi
}

# GPT-3 175B, 1,024 ranks (a global batch of 256 keeps the test short: 32 micro-batches).
"$BIN" simulate --model gpt3-175b --cluster dgx-a100-80g --nodes 128 --tp 8 --pp 16 --dp 8 \
  --micro-batch 1 --global-batch 256 --recompute full --trace "$WORK/gpt3.h5" >/dev/null
"$BIN" report --trace "$WORK/gpt3.h5" -o "$WORK/gpt3.html"
browse gpt3 1400,1500
# A search (per-layer search, both baselines, estimator-ranked to stay quick).
"$BIN" search --model gpt3-1.3b --cluster dgx-a100-80g --nodes 1 --global-batch 64 \
  --memory-budget-gib 32 --top 2 --rerank estimator --quiet --json > "$WORK/search.json"
"$BIN" report --search "$WORK/search.json" -o "$WORK/search.html"
browse search 1100,1000

/usr/bin/python3 - "$WORK" <<'PY'
import json, re, sys
from PIL import Image
work = sys.argv[1]
def check_png(name):
    im = Image.open(f"{work}/{name}.png").convert("RGB")
    small = im.resize((im.width // 4, im.height // 4))
    colors = small.getcolors(1 << 20) or []
    inked = sum(n for n, c in colors if sum(c) < 3 * 235)
    frac = inked / (small.width * small.height)
    assert len(colors) > 20 and frac > 0.02, f"{name}.png looks blank ({len(colors)} colours, {frac:.1%} inked)"
    return frac
def dom(name):
    d = open(f"{work}/{name}.dom").read()
    assert 'id="report-ready"' in d, f"{name}: the page's script did not finish"
    return d

d = dom("gpt3")
svg = re.search(r'<svg id="timeline-svg".*?</svg>', d, re.S)
assert svg, "gpt3: no timeline SVG in the DOM"
stages = [int(s) for s in re.findall(r'<g class="rank-row" data-rank="\d+" data-stage="(\d+)"', svg.group(0))]
assert stages == list(range(16)), f"gpt3: timeline rows by stage {stages}, expected one per stage 0..15"
mem = re.findall(r'<svg class="mem-chart" data-stage="(\d+)"', d)
bal = re.findall(r'<g class="balance-row" data-stage="(\d+)"', d)
assert [int(s) for s in mem] == list(range(16)), f"gpt3: memory charts {mem}"
assert [int(s) for s in bal] == list(range(16)), f"gpt3: balance rows {bal}"
rects = len(re.findall(r'<rect class="k\d"', svg.group(0)))
assert rects > 16 * 32, f"gpt3: only {rects} timeline blocks"
f1 = check_png("gpt3")

s = json.load(open(f"{work}/search.json"))
n = s["evaluated_candidates"]["recorded"]
d = dom("search")
front = re.search(r'<svg id="front".*?</svg>', d, re.S).group(0)
points = len(re.findall(r'<circle class="cand ', front))
assert points == n, f"search: {points} points drawn, {n} candidates recorded"
for what in ('class="mark chosen"', 'class="pareto"', 'class="budget"', 'class="mark megatron"'):
    assert what in front, f"search: no {what}"
f2 = check_png("search")
print(f"ok: gpt3 page: 16 stages, {rects} timeline blocks, {f1:.0%} inked; "
      f"search page: {points} candidate points, {f2:.0%} inked; no console messages")
PY
if [ -n "${KEEP_DIR:-}" ]; then
  mkdir -p "$KEEP_DIR"
  cp "$WORK/gpt3.png" "$KEEP_DIR/report-gpt3-175b.png"
  cp "$WORK/search.png" "$KEEP_DIR/report-search.png"
  echo "kept $KEEP_DIR/report-gpt3-175b.png $KEEP_DIR/report-search.png"
fi
