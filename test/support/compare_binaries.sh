#!/usr/bin/env bash
# A refactor of the runtime changes nothing a run computes: trains five plans (serial; tp 2 x
# pp 2 x dp 2 with full recompute and ZeRO-1; dp 4 ZeRO-3 offloading weights and optimizer;
# dp 2 ZeRO-2 with selective recompute offloading activations and optimizer; pp 2 interleaved)
# for 3 steps with two binaries and prints, per plan, rank 0's device and host high water of
# each, the steps' losses, grad norms and learning rates that differ, and the checkpoint
# datasets (weights, AdamW moments) that differ bit for bit. Not a ctest: it needs both binaries.
#   OLD=base/build/stratagem NEW=build/stratagem test/support/compare_binaries.sh
set -uo pipefail
: "${OLD:?set OLD to the reference stratagem}" "${NEW:?set NEW to the changed stratagem}"
PY=${PY:-/usr/bin/python3}  # with h5py
W=$(mktemp -d "${TMPDIR:-/tmp}"/compare_binaries.XXXXXX)
trap 'rm -rf "$W"' EXIT
export OMP_NUM_THREADS=1 STRATAGEM_BACKEND=cpu
MPIRUN=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
TEXT=/usr/share/common-licenses/GPL-3
[ -f "$TEXT" ] || TEXT=$(dirname "$0")/../../README.md
"$NEW" data tokenize "$TEXT" -o "$W/data.bin" >/dev/null
MODEL=(--layers 4 --hidden 64 --heads 4 --vocab 256 --seq-len 32 --global-batch 8
       --micro-batch 2 --dtype fp32)
compare() {  # name np plan-flags...
  local name=$1 np=$2 bin; shift 2
  for bin in OLD NEW; do
    timeout 300 "${MPIRUN[@]}" -np "$np" "${!bin}" train --data "$W/data.bin" --steps 3 \
      --log-json "$W/$name.$bin.jsonl" --ckpt-dir "$W/$name.$bin" --json "${MODEL[@]}" "$@" \
      >"$W/$name.$bin.log" 2>&1 || { echo "FAIL $name ($bin): $(tail -3 "$W/$name.$bin.log")"; return; }
  done
  $PY - "$W/$name" <<'PY'
import json, sys
import h5py
run = sys.argv[1]
def steps(b): return [json.loads(line) for line in open(f"{run}.{b}.jsonl")]
def high_water(b):
    t = open(f"{run}.{b}.log").read()
    j = json.loads(t[t.index("{"):t.rindex("}") + 1])
    return j["high_water_bytes"], j["host_high_water_bytes"]
old, new = steps("OLD"), steps("NEW")
differ = [(i, k, old[i][k], new[i].get(k)) for i in range(len(old))
          for k in ("loss", "grad_norm", "lr") if old[i][k] != new[i].get(k)]
a, b = h5py.File(f"{run}.OLD/step-00000003.h5", "r"), h5py.File(f"{run}.NEW/step-00000003.h5", "r")
datasets = []
a.visititems(lambda name, obj: datasets.append(name) if isinstance(obj, h5py.Dataset) else None)
bits = [n for n in datasets if a[n][()].tobytes() != b[n][()].tobytes()]
print(f"{run.split('/')[-1]}: high water (device, host) old {high_water('OLD')} new "
      f"{high_water('NEW')}; steps differing {differ}; of {len(datasets)} checkpoint datasets, "
      f"differing bit for bit {bits}")
PY
}
compare serial 1 --dp 1
compare tp2_pp2_dp2_full_z1 8 --tp 2 --pp 2 --dp 2 --recompute full --zero 1
compare dp4_z3_offload 4 --dp 4 --zero 3 --offload params,optimizer
compare dp2_z2_selective_offload 2 --dp 2 --zero 2 --recompute selective \
  --offload activations,optimizer
compare pp2_interleaved 2 --pp 2 --vpp 2 --dp 1 --schedule interleaved
