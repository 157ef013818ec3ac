#!/usr/bin/env bash
# `stratagem profile` on this node: measures with the CPU backend, writes a cluster file that
# every command loads, reports fit errors, and refuses bad input before measuring anything.
source "$(dirname "$0")/common.sh"
OUT="$WORK/measured.json"
"${MPIRUN[@]}" -np 2 "$BIN" profile --quick -o "$OUT" > "$WORK/profile.txt" 2> "$WORK/progress.txt"
grep -q "cost model error" "$WORK/profile.txt" || fail "no fit report: $(cat "$WORK/profile.txt")"
grep -q "profile: gemm" "$WORK/progress.txt" || fail "no progress lines on stderr"
$PY - "$OUT" <<'PY' || fail "measured cluster file: see above"
import json, sys
j = json.load(open(sys.argv[1]))
p = j["profile"]
assert p["backend"] == "cpu" and p["ranks"] == 2, p["backend"]
# A shared figure (the launch overhead, the GEMM or stream group) is either taken or kept from
# the file with the reason, when taking it would leave some kind worse than the file.
kept = lambda group: any(s.startswith(group) and s.endswith("; kept") for s in p["not_measured"])
assert "gpu.gemm.max_efficiency" in p["measured_fields"] or kept("gpu.gemm:")
assert "gpu.kernel_launch_s" in p["measured_fields"] or kept("gpu.kernel_launch_s (")
assert "node.intra.allreduce_bus_efficiency" in p["measured_fields"] or kept("node.intra:")
assert any("nics" in s for s in p["not_measured"])
assert len(p["gemm"]) >= 4 and all(r["time_s"] > 0 for r in p["gemm"])
assert len(p["all_reduce"]) >= 3
for k in ("gemm", "attention", "stream", "all_reduce", "copy"):
    after, before = p["fit_error_after"][k + "_error_pct"], p["fit_error_before"][k + "_error_pct"]
    # No kind ends worse than the file (to rounding), the launch overhead's share included.
    assert after <= before + 1e-9, (k, after, before)
print("ok: measured file:", {k: round(v, 1) for k, v in p["fit_error_after"].items() if k != "definition"})
PY
# The file is a cluster like any other.
PLAN=(--layers 2 --hidden 64 --heads 4 --vocab 256 --seq-len 32 --dp 4 --micro-batch 1 --global-batch 4 --dtype fp32)
"$BIN" estimate "${PLAN[@]}" --cluster "$OUT" --nodes 1 --json > "$WORK/est.json"
"$BIN" simulate "${PLAN[@]}" --cluster "$OUT" --nodes 1 --json > "$WORK/sim.json"
$PY -c 'import json,sys; assert json.load(open(sys.argv[1]))["iteration_time_s"] > 0' "$WORK/est.json"
echo "ok: estimate and simulate load the measured file"
# --json summary
"${MPIRUN[@]}" -np 1 "$BIN" profile --quick --json > "$WORK/p.json"
$PY -c 'import json,sys; j=json.load(open(sys.argv[1])); assert "fit_error_after" in j and "measured_fields" in j and "gemm" not in j' "$WORK/p.json"
echo "ok: --json"

expect() {  # needle np args...: exit 2 before any measurement
  expect_failure profile "$@"
  [ $rc -eq 2 ] || fail "exit $rc (expected 2) for: $*: $out"
  if grep -q "profile: gemm" <<<"$out"; then fail "measured before refusing: $*"; fi
  echo "ok: $1"
}
expect "does not exist" 1 --quick -o "$WORK/no/such/dir/m.json"
expect "at most one rank per device" 5 --quick
expect "min-time-s" 1 --quick --min-time-s 0
expect "expected cpu|cuda" 1 --backend tpu
expect "not implemented yet" 1 --backend cuda
expect "no-such-cluster" 1 --cluster no-such-cluster
expect "describes A100" 1 --cluster dgx-a100-80g
[ ! -e "$WORK/no" ] || fail "a refused run left files behind"
echo "PASS"
