#!/usr/bin/env bash
# Interop from the command line, one block per acceptance line of the interop issue:
# Hugging Face imports against published totals; the Llama-3-8B import simulates as the built-in;
# the searched gpt3-175b plans exported to Megatron-LM (flags and values; the per-layer best of
# the full space with --nearest), read back as the same plan, and exported to torchtitan
# (tomllib parses it) and DeepSpeed (zero_optimization.stage),
# every name held against test/data/frameworks/; a heterogeneous plan refused with its layers and
# exported with --nearest and both forecasts; tp 16 across nodes slower than tp 8; a 2-GPU job;
# bad input exits 2 with one line.
set -euo pipefail
BIN=${STRATAGEM_BIN:?set STRATAGEM_BIN}
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=$HERE/../data
WORK=$(mktemp -d "${TMPDIR:-/tmp}"/stratagem-interop.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
source "$(dirname "$0")/../cli_helpers.sh"

# --- Hugging Face imports: parameters within 0.5% of the published totals -------------------------
for pair in llama3-8b:8.03e9 qwen2-7b:7.62e9 gpt2:124e6 gpt-neox-20b:20.6e9; do
  name=${pair%%:*} total=${pair#*:}
  # Qwen2's 131072 positions are its served context, not a training sequence: give one.
  seq=()
  [ "$name" != qwen2-7b ] || seq=(--seq-len 4096)
  p=$("$BIN" model import "$DATA/hf/$name.json" "${seq[@]}" -o "$WORK/$name.model.json" --json |
    json 'd["parameters"]')
  python3 -c "import sys; p, t = $p, $total; sys.exit(0 if abs(p - t) / t < 0.005 else 1)" ||
    fail "$name: $p parameters, published $total"
  # The written model is a stratagem model file.
  "$BIN" model show "$WORK/$name.model.json" >/dev/null || fail "$name: written model unreadable"
done

# --- MoE imports: Mixtral and DeepSeek-V3 total and active parameters (issue #26) ----------------
for row in mixtral-8x7b:46.7e9:12.9e9:0.01 deepseek-v3:671e9:37e9:0.02; do
  IFS=: read -r name total active tol <<<"$row"
  out=$("$BIN" model import "$DATA/hf/$name.json" --seq-len 4096 -o "$WORK/$name.model.json" --json)
  t=$(echo "$out" | json 'd["total_params"]') a=$(echo "$out" | json 'd["active_params"]')
  python3 -c "import sys; sys.exit(0 if abs($t - $total) / $total < $tol and abs($a - $active) / $active < $tol else 1)" ||
    fail "$name: $t total / $a active, published $total / $active"
  # The written model reads back with the same counts.
  [ "$("$BIN" model show "$WORK/$name.model.json" --json | json 'd["active_params"]')" = "$a" ] ||
    fail "$name: the written model's active parameters differ"
done
echo "$out" | json 'd["notes"][0]' | has "multi-token-prediction" || fail "deepseek-v3: no MTP note"

# --- the Llama-3-8B import simulates as the built-in llama3-8b -------------------------------------
SIM=(--cluster dgx-a100-80g --nodes 1 --tp 4 --pp 2 --micro-batch 1 --global-batch 8 --json)
a=$("$BIN" simulate --model "$DATA/hf/llama3-8b.json" "${SIM[@]}" | json 'd["iteration_time_s"]')
b=$("$BIN" simulate --model llama3-8b "${SIM[@]}" | json 'd["iteration_time_s"]')
[ "$a" = "$b" ] || fail "llama3-8b import simulates at $a s, the built-in at $b s"

# --- the searched gpt3-175b plans: Megatron-LM, torchtitan, DeepSpeed ------------------------------
# The full space's best plan is per-layer (Galvatron-style): Megatron-LM cannot state it, so the
# export names the layers and --nearest exports the nearest plan, which reads back as itself.
# The Megatron space's best plan (uniform) exports with its own values and reads back as itself.
JOB=(--model gpt3-175b --cluster dgx-a100-80g --nodes 128)
"$BIN" search "${JOB[@]}" --global-batch 1536 --rerank estimator --quiet -o "$WORK/full.json" \
  >/dev/null
"$BIN" search "${JOB[@]}" --global-batch 1536 --rerank estimator --quiet --space megatron \
  -o "$WORK/plan.json" >/dev/null
set +e
out=$("$BIN" export --to megatron --plan "$WORK/full.json" "${JOB[@]}" 2>&1)
rc=$?
set -e
plans=(plan full)
if [ $rc = 2 ]; then
  plans=(plan)
  echo "$out" | has "layers [0-9]" || fail "per-layer plan refused without its layers: $out"
  # Its ZeRO-3 at tp 2, pp 1 becomes Megatron's distributed optimizer, which holds 175B weights
  # over 2 GPUs: no recompute, offload or micro-batch makes that fit, so --nearest exits 3 (D11).
  set +e
  out=$("$BIN" export --to megatron --plan "$WORK/full.json" "${JOB[@]}" --nearest \
    -o "$WORK/nearest.args" --plan-out "$WORK/nearest.json" 2>&1)
  rc=$?
  set -e
  if [ $rc = 0 ]; then
    grep -q "iteration (s)" <<<"$out" || fail "--nearest prints no forecasts"
    "$BIN" plan import --from megatron --args-file "$WORK/nearest.args" "${JOB[@]:2}" \
      -o "$WORK/nearest.back.json" >/dev/null
    cmp -s "$WORK/nearest.json" "$WORK/nearest.back.json" || fail "nearest plan does not read back"
  else
    [ $rc = 3 ] && [ ! -e "$WORK/nearest.args" ] || fail "--nearest: exit $rc: $out"
    echo "$out" | has "fits the memory budget" || fail "--nearest exit 3 without saying why: $out"
  fi
else
  [ $rc = 0 ] || fail "export of the searched plan: exit $rc: $out"
fi
for plan in "${plans[@]}"; do
  "$BIN" export --to megatron --plan "$WORK/$plan.json" "${JOB[@]}" -o "$WORK/megatron.args" \
    >/dev/null
  python3 - "$WORK/$plan.json" "$WORK/megatron.args" <<'EOF' || fail "megatron flags differ from the plan"
import json, shlex, sys
plan = json.load(open(sys.argv[1]))
lines = [l for l in open(sys.argv[2]) if not l.startswith("#")]
t = shlex.split(" ".join(lines))
flag = lambda f: t[t.index(f) + 1]
layer = plan["layers"][0]
assert int(flag("--tensor-model-parallel-size")) == layer["tp"], "tp"
assert int(flag("--pipeline-model-parallel-size")) == plan["pp"], "pp"
assert int(flag("--micro-batch-size")) == plan["micro_batch"], "micro batch"
assert int(flag("--global-batch-size")) == plan["global_batch"], "global batch"
EOF
  python3 "$HERE/check_names.py" megatron "$WORK/megatron.args" "$DATA/frameworks/megatron-lm.txt" \
    >/dev/null || fail "megatron export writes a name Megatron-LM does not accept"
  "$BIN" plan import --from megatron --args-file "$WORK/megatron.args" "${JOB[@]:2}" \
    -o "$WORK/back.json" --model-out "$WORK/back.model.json" >/dev/null
  python3 -c "import json,sys; a, b = (json.load(open(f)) for f in sys.argv[1:]); sys.exit(a != b)" \
    "$WORK/$plan.json" "$WORK/back.json" || fail "plan import of the export is not the plan"
done
# The same through the arguments after --.
mapfile -t ARGS < <(grep -v '^#' "$WORK/megatron.args" | tr ' ' '\n')
"$BIN" plan import --from megatron --cluster dgx-a100-80g --nodes 128 -o "$WORK/back2.json" \
  -- "${ARGS[@]}" >/dev/null
cmp -s "$WORK/back.json" "$WORK/back2.json" || fail "arguments after -- read differently"

# Megatron's plan (ZeRO-1, interleaved) as torchtitan and DeepSpeed state the nearest of it.
"$BIN" export --to torchtitan --plan "$WORK/plan.json" "${JOB[@]}" --nearest -o "$WORK/job.toml" \
  >/dev/null
python3 "$HERE/check_names.py" torchtitan "$WORK/job.toml" "$DATA/frameworks/torchtitan.txt" \
  "$DATA/frameworks/torchtitan-schedules.txt" >/dev/null || fail "torchtitan export"
python3 -c "import tomllib,sys; tomllib.load(open(sys.argv[1],'rb'))" "$WORK/job.toml"

"$BIN" export --to deepspeed --plan "$WORK/plan.json" "${JOB[@]}" --nearest \
  -o "$WORK/ds_config.json" >"$WORK/ds.out"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d['zero_optimization']['stage']" \
  "$WORK/ds_config.json" || fail "deepspeed export has no zero_optimization.stage"
python3 "$HERE/check_names.py" deepspeed "$WORK/ds_config.json" "$DATA/frameworks/deepspeed.txt" \
  >/dev/null || fail "deepspeed export writes a key DeepSpeed does not accept"
sed -n 's/^Megatron-DeepSpeed flags: //p' "$WORK/ds.out" >"$WORK/mds.args"
python3 "$HERE/check_names.py" megatron-deepspeed "$WORK/mds.args" \
  "$DATA/frameworks/megatron-deepspeed.txt" >/dev/null || fail "Megatron-DeepSpeed flags"

# --- a heterogeneous plan: refused naming its layers; --nearest exports and prints both ----------
SMALL=(--model gpt3-1.3b --cluster dgx-a100-80g --nodes 1)
"$BIN" plan check "${SMALL[@]}" --tp 2 --pp 2 --global-batch 64 -o "$WORK/uniform.json" >/dev/null
python3 - "$WORK/uniform.json" "$WORK/hetero.json" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
runs = []  # runs are [begin, end) layer ranges; layers 12 on get tp 4
for run in p["layers"]:
    a, b = run["layers"]
    if a < 12 < b:
        runs += [dict(run, layers=[a, 12]), dict(run, layers=[12, b], tp=4, dp=1)]
    else:
        runs.append(dict(run, tp=4, dp=1) if a >= 12 else run)
p["layers"] = runs
json.dump(p, open(sys.argv[2], "w"))
EOF
for target in megatron torchtitan deepspeed; do
  set +e
  out=$("$BIN" export --to $target --plan "$WORK/hetero.json" "${SMALL[@]}" 2>&1)
  rc=$?
  set -e
  [ $rc = 2 ] || fail "heterogeneous plan to $target: exit $rc: $out"
  [ "$(echo "$out" | wc -l)" = 1 ] || fail "heterogeneous plan to $target: not one line: $out"
  echo "$out" | has "layers 12-23 tp4 dp1" || fail "$target: layers not named: $out"
  "$BIN" export --to $target --plan "$WORK/hetero.json" "${SMALL[@]}" --nearest \
    -o "$WORK/nearest.$target" >"$WORK/nearest.out"
  grep -q "iteration (s)" "$WORK/nearest.out" || fail "--nearest prints no forecasts"
  grep -q "exported:" "$WORK/nearest.out" || fail "--nearest prints no exported plan"
done

# --- tensor parallelism across nodes, and a job on part of a node ---------------------------------
TP=(--model gpt3-175b --layers 8 --cluster dgx-a100-80g --nodes 4 --pp 1 --micro-batch 1
  --global-batch 64 --sequence-parallel --json)
t16=$("$BIN" simulate "${TP[@]}" --tp 16 | json 'd["iteration_time_s"]')
t8=$("$BIN" simulate "${TP[@]}" --tp 8 | json 'd["iteration_time_s"]')
python3 -c "import sys; sys.exit(0 if $t16 > $t8 else 1)" || fail "tp 16 ($t16 s) not slower than tp 8 ($t8 s)"
w=$("$BIN" simulate --model gpt2-124m --cluster dgx-a100-80g --nodes 1 --gpus-per-node 2 --dp 2 \
  --global-batch 16 --json | json 'd["world_size"] if "world_size" in d else len(d["ranks"])')
[ "$w" = 2 ] || fail "--gpus-per-node 2 simulated $w ranks"

# --- bad input: exit 2 with one line ---------------------------------------------------------------
echo '{"architectures": [' >"$WORK/broken.json"
sed 's/LlamaForCausalLM/FalconForCausalLM/' "$DATA/hf/llama3-8b.json" >"$WORK/falcon.json"
echo "--num-layers 4 --tensor-model-parallel-size" >"$WORK/novalue.args"
bad model import "$WORK/broken.json" | has broken.json || fail "not-JSON config"
bad model import "$WORK/falcon.json" | has FalconForCausalLM || fail "unknown architecture"
sed 's/MixtralForCausalLM/Qwen2MoeForCausalLM/' "$DATA/hf/mixtral-8x7b.json" >"$WORK/qwen-moe.json"
bad model import "$WORK/qwen-moe.json" | has "Mixture-of-Experts is not supported yet" ||
  fail "MoE architecture"
bad plan import --from megatron --args-file "$WORK/novalue.args" |
  has "--tensor-model-parallel-size: needs a value" || fail "flag without value"
bad export --to nemo --plan "$WORK/plan.json" "${JOB[@]}" | has "unknown target" ||
  fail "unknown target"
bad simulate --model "$WORK/falcon.json" --tp 2 | has FalconForCausalLM || fail "--model HF"
echo "interop cli: all passed"
