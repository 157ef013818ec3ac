# layer_plan OUT.json "SHORTHAND" 'EDIT' MODEL-FLAGS...: writes the shorthand plan (on
# cpu-local, fp32) with per-layer strategies set by Python statements on `p`, where
# L(begin, end, field=value...) is a run of layers like the shorthand's. Sourced by the tests
# and benchmarks that train per-layer plans; needs $BIN.
layer_plan() {
  local out=$1 flags=$2 edit=$3; shift 3
  # shellcheck disable=SC2086
  "$BIN" plan check "$@" --cluster cpu-local --dtype fp32 $flags -o "$out.base.json" >/dev/null ||
    return 1
  "${PY:-/usr/bin/python3}" - "$out.base.json" "$out" "$edit" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
(run,) = p["layers"]
def L(b, e, **kw):
    r = json.loads(json.dumps(run))
    r.update(kw)
    r["layers"] = [b, e]
    return r
exec(sys.argv[3])
json.dump(p, open(sys.argv[2], "w"))
PY
}
