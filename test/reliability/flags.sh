#!/usr/bin/env bash
# Accepted nonsense (issue 30, item 7): each flag and field below was accepted (exit 0) or failed
# late; each is now refused at once, exit 2, with one line naming it.
source "$(dirname "$0")/common.sh"
D=(--data "$WORK/data.bin" --steps 1)
expect_rc 2 "flag --memory-budget-gib: expected GiB in [0.0009765625 (1 MiB), 1048576], got 1e-10" \
  "$BIN" search --model gpt2-124m --nodes 1 --global-batch 8 --memory-budget-gib 1e-10
expect_rc 2 "flag --lr: expected a learning rate >= 0 that fp32 holds, got -1" "${TRAIN[@]}" "${D[@]}" --lr -1
expect_rc 2 "flag --lr: expected a learning rate >= 0 that fp32 holds, got 1e39" "${TRAIN[@]}" "${D[@]}" --lr 1e39
expect_rc 2 "flag --min-lr: expected a learning rate in [0, --lr], got 1" "${TRAIN[@]}" "${D[@]}" --lr 0.5 --min-lr 1
expect_rc 2 "flag --weight-decay: expected a weight decay >= 0 that fp32 holds, got -10" \
  "${TRAIN[@]}" "${D[@]}" --weight-decay -10
expect_rc 2 "flag --stop-after: expected an integer in [1, 1000000000], got 0" "${TRAIN[@]}" "${D[@]}" --stop-after 0
expect_rc 2 "flag --signal-grace-s: expected seconds in [0, 1e6] (0: no bound), got -1" \
  "${TRAIN[@]}" "${D[@]}" --signal-grace-s -1
# Float tokens in an HDF5 --data (libhdf5 would have truncated 3.7 to 3).
$PY - "$WORK/float.h5" <<'PY'
import h5py, numpy, sys
with h5py.File(sys.argv[1], "w") as f:
    f["tokens"] = numpy.arange(1000, dtype=numpy.float32) % 200 + 0.5
PY
expect_rc 2 "--data $WORK/float.h5: dataset '/tokens' does not hold integers (floating-point values)" \
  "${TRAIN[@]}" --data "$WORK/float.h5" --steps 1
# Cluster fields: no NICs, no SMs.
CL=$(dirname "$0")/../../data/clusters/cpu-local.json
sed 's/"nics": {"count": 1,/"nics": {"count": 0,/' "$CL" >"$WORK/nonic.json"
sed 's/"sm_count": 1,/"sm_count": 0,/' "$CL" >"$WORK/nosm.json"
! cmp -s "$CL" "$WORK/nonic.json" && ! cmp -s "$CL" "$WORK/nosm.json" || fail "cpu-local.json changed shape: edit this test"
expect_rc 2 "count" "$BIN" estimate --model gpt2-124m --cluster "$WORK/nonic.json" --nodes 2 --dp 8 --global-batch 8
grep -q "nics" <<<"$out" || fail "the line does not name nics: $out"
expect_rc 2 "sm_count" "$BIN" estimate --model gpt2-124m --cluster "$WORK/nosm.json" --nodes 1 --dp 4 --global-batch 8
echo ok
