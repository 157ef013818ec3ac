#!/usr/bin/env bash
# `stratagem report` without a browser: the page of a small simulated trace holds one timeline
# rank per rank, one memory chart and one balance row per stage; a forecast against a measured
# CPU run gets its comparison; a search result draws every recorded candidate; bad input exits
# 2 with one line (missing file, another schema version, a search JSON without candidates).
set -euo pipefail
BIN=${STRATAGEM_BIN:?set STRATAGEM_BIN}
WORK=$(mktemp -d "${TMPDIR:-/tmp}"/stratagem-report.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
export OMP_NUM_THREADS=1 SOURCE_DATE_EPOCH=0
fail() { echo "FAIL: $*" >&2; exit 1; }

# A simulated trace of every rank (8 ranks, pp 2) and a measured CPU run with its forecast.
"$BIN" simulate --model gpt2-124m --cluster dgx-a100-80g --nodes 1 --tp 2 --pp 2 --dp 2 \
  --micro-batch 2 --global-batch 32 --trace "$WORK/small.h5" >/dev/null
MODEL=(--layers 2 --hidden 64 --heads 2 --vocab 256 --seq-len 32)
PLAN=(--dp 4 --micro-batch 2 --global-batch 8 --dtype fp32)
head -c 200000 /usr/share/common-licenses/GPL-3 > "$WORK/corpus.txt"
"$BIN" data tokenize "$WORK/corpus.txt" -o "$WORK/corpus.bin" >/dev/null
"${MPIRUN[@]}" -np 4 "$BIN" train "${MODEL[@]}" "${PLAN[@]}" --data "$WORK/corpus.bin" --steps 2 \
  --log-every 100 --trace "$WORK/run.h5" >/dev/null
"$BIN" simulate "${MODEL[@]}" "${PLAN[@]}" --cluster cpu-local --nodes 1 \
  --trace "$WORK/forecast.h5" >/dev/null
"$BIN" search --model gpt3-1.3b --cluster dgx-a100-80g --nodes 1 --global-batch 64 --top 2 \
  --rerank estimator --quiet --json > "$WORK/search.json"

"$BIN" report --trace "$WORK/small.h5" -o "$WORK/small.html" >/dev/null
"$BIN" report --trace "$WORK/forecast.h5" --measured "$WORK/run.h5" -o "$WORK/cmp.html" >/dev/null
"$BIN" report --search "$WORK/search.json" -o "$WORK/search.html" >/dev/null

/usr/bin/python3 - "$WORK" <<'PY'
import json, re, sys
work = sys.argv[1]
def page(name):
    return open(f"{work}/{name}").read()
def timeline(html):
    m = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', html, re.S)
    assert m, "no timeline data"
    return json.loads(m.group(1).replace("<\\/", "</"))
small = page("small.html")
# Self-contained: nothing fetched from elsewhere.
for bad in ("http://", "https://", "src=", "<link", "@import", "url("):
    assert bad not in small.replace("http://www.w3.org/2000/svg", ""), f"page refers outside: {bad}"
t = timeline(small)
assert [v["name"] for v in t["views"]] == ["every rank"], t["views"]
drawn = [t["ranks"][i][0] for i in t["views"][0]["ranks"]]
assert drawn == list(range(8)), drawn
assert len(re.findall(r'<svg class="mem-chart" data-stage=', small)) == 2
assert len(re.findall(r'<g class="balance-row" data-stage=', small)) == 2
# Blocks: every op of rank 0's compute stream is in exactly one block.
rows = dict((r[0], r[1]) for r in t["ranks"][t["views"][0]["ranks"][0]][2])
assert 0 in rows and sum(rows[0][4::5]) > 0
for section in ("id=\"timeline\"", "id=\"memory\"", "id=\"balance\"", "tokens/s", "MFU"):
    assert section in small, section

cmp = page("cmp.html")
assert 'id="compare"' in cmp, "no forecast-against-measured section"
assert "iteration time" in cmp and "peak memory" in cmp and "stage 0: compute" in cmp

s = json.load(open(f"{work}/search.json"))
ev = s["evaluated_candidates"]
assert ev["recorded"] == len(ev["plans"]) > 0 and ev["evaluated"] == s["candidates_evaluated"]
assert any(p["pareto"] for p in ev["plans"])
# The recorded front is the Pareto front of the recorded plans (none dominates another).
front = [p for p in ev["plans"] if p["pareto"]]
for p in ev["plans"]:
    dominated = any(q["peak_memory_bytes"] <= p["peak_memory_bytes"] and
                    q["tokens_per_s"] >= p["tokens_per_s"] and
                    (q["peak_memory_bytes"], q["tokens_per_s"]) !=
                    (p["peak_memory_bytes"], p["tokens_per_s"]) for q in ev["plans"])
    assert p["pareto"] == (not dominated), p
html = page("search.html")
assert len(re.findall(r'<circle class="cand ', html)) == ev["recorded"]
assert 'class="mark chosen"' in html and 'class="budget"' in html and 'class="pareto"' in html
print(f"ok: pages of {len(drawn)} ranks, a comparison, and {ev['recorded']} of "
      f"{ev['evaluated']} search candidates ({len(front)} on the front)")
PY

# Bad input: exit 2 and one line naming the file.
expect_bad() {  # description, args...
  local what=$1; shift
  local rc=0
  "$BIN" report "$@" -o "$WORK/bad.html" >"$WORK/out" 2>"$WORK/err" || rc=$?
  [ "$rc" = 2 ] || fail "$what: exit $rc, expected 2 ($(cat "$WORK/err"))"
  [ "$(wc -l < "$WORK/err")" = 1 ] || fail "$what: expected one line, got: $(cat "$WORK/err")"
  echo "ok $what: $(cat "$WORK/err")"
}
expect_bad "missing trace" --trace "$WORK/none.h5"
expect_bad "missing search" --search "$WORK/none.json"
cp "$WORK/small.h5" "$WORK/v2.h5"
/usr/bin/python3 -c "import h5py, sys; f = h5py.File(sys.argv[1], 'r+'); f.attrs['schema_version'] = 2" "$WORK/v2.h5"
expect_bad "trace of schema_version 2" --trace "$WORK/v2.h5"
/usr/bin/python3 -c "
import json, sys; s = json.load(open(sys.argv[1])); del s['evaluated_candidates']
json.dump(s, open(sys.argv[2], 'w'))" "$WORK/search.json" "$WORK/nocand.json"
expect_bad "search JSON without candidates" --search "$WORK/nocand.json"
echo '{"feasible": false}' > "$WORK/infeasible.json"
expect_bad "search JSON of no feasible plan" --search "$WORK/infeasible.json"
expect_bad "not a trace" --trace "$WORK/search.json"
expect_bad "rank not in the trace" --trace "$WORK/small.h5" --ranks 99
