"""Checks of a parallel run against its serial twin (used by parallel_equals_serial.sh).

  check_run.py losses SERIAL.jsonl PARALLEL.jsonl TOL|derived SERIAL_CKPT.h5
  check_run.py weights SERIAL.h5 PARALLEL.h5 TOL|derived SERIAL.jsonl
  check_run.py final_loss A.jsonl B.jsonl derived CKPT.h5   (the last step's losses)
                                                     (checkpoints: full logical tensors;
                                                      max absolute difference)
  With `derived`, the tolerance follows from the arithmetic of the run (tolerance.py): the
  model's reduction lengths, the number of steps, the learning rates and AdamW's state.
  check_run.py memory TRACE.h5 SIMULATE.json TOL      (measured vs forecast peak, per rank)
  check_run.py cp_ops TRACE.h5 FORECAST.h5            (the cp transfers and attention parts)
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tolerance  # noqa: E402  (beside this file)


def losses(a, b, tol, checkpoint=None):
    x = [json.loads(l)["loss"] for l in open(a)]
    y = [json.loads(l)["loss"] for l in open(b)]
    assert len(x) == len(y) > 0, (x, y)
    if tol == "derived":
        model, plan, _, _ = tolerance.run_facts(checkpoint, a)
        tol = tolerance.loss_rtol(model, plan, len(x))
    worst = max(abs(p - q) / abs(p) for p, q in zip(x, y))
    assert worst <= tol, f"losses differ by {worst:.2e} > {tol:.2e}: {x} vs {y}"
    return f"losses within {worst:.1e} (bound {tol:.1e})"


def final_loss(a, b, tol, checkpoint):
    """The last logged losses of two runs (one of them resumed, perhaps on another layout)."""
    x = json.loads(open(a).readlines()[-1])
    y = json.loads(open(b).readlines()[-1])
    assert x["step"] == y["step"], (x, y)
    model, plan, _, _ = tolerance.run_facts(checkpoint, a)
    tol = tolerance.loss_rtol(model, plan, x["step"])
    err = abs(x["loss"] - y["loss"]) / abs(x["loss"])
    assert err <= tol, f"step {x['step']} losses differ by {err:.2e} > {tol:.2e}: {x['loss']} vs {y['loss']}"
    return f"step {x['step']} losses within {err:.1e} (derived bound {tol:.1e})"


def weights(a, b, tol, log=None):
    if tol == "derived":
        return derived_weights(a, b, log)
    import h5py
    import numpy as np
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        names = []
        fa["params"].visit(lambda n: names.append(n) if isinstance(fa["params"][n], h5py.Dataset) else None)
        assert names, "no parameters in " + a
        worst, where = 0.0, ""
        for n in names:
            p, q = fa["params"][n][()], fb["params"][n][()]
            assert p.shape == q.shape, f"{n}: {p.shape} vs {q.shape}"
            # Absolute: the weights are O(0.02..1), and AdamW turns the last-bit differences
            # of a reordered sum into relative differences of near-zero entries (biases).
            err = float(np.abs(p - q).max())
            if err >= worst:
                worst, where = err, n
        assert worst <= tol, f"final weights differ: {where} by {worst:.2e} > {tol}"
    return f"{len(names)} weight tensors within {worst:.1e} ({where})"


def derived_weights(a, b, log):
    """Each element within the derived bound (tolerance.weight_atol) plus one ulp of its own
    per step (each update rounds to the weight's precision); prints the worst element against
    its bound."""
    import h5py
    import numpy as np
    model, plan, _, lrs = tolerance.run_facts(a, log)
    steps = len(lrs)
    bound = tolerance.weight_atol(model, plan, lrs)
    worst, where = 0.0, ""
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        names = []
        fa["params"].visit(lambda n: names.append(n) if isinstance(fa["params"][n], h5py.Dataset) else None)
        assert names, "no parameters in " + a
        for n in names:
            p = fa["params"][n][()].astype(np.float64)
            q = fb["params"][n][()].astype(np.float64)
            assert p.shape == q.shape, f"{n}: {p.shape} vs {q.shape}"
            atol = bound + steps * 2 * tolerance.U * np.abs(p)
            ratio = np.abs(p - q) / atol
            i = int(ratio.argmax())
            if ratio.flat[i] >= worst:
                worst = float(ratio.flat[i])
                where = f"{n}[{i}] by {abs(p.flat[i] - q.flat[i]):.2e} of {atol.flat[i]:.2e} allowed"
    assert worst <= 1, f"final weights differ beyond the derived bound: {where}"
    return f"{len(names)} weight tensors within the derived bound (worst {worst:.3f} of it: {where})"


def memory(trace, forecast, tol):
    import h5py
    sim = json.load(open(forecast))
    predicted = {r["rank"]: r["peak_memory_bytes"] for r in sim["per_rank"]}
    worst, lines = 0.0, []
    with h5py.File(trace, "r") as f:
        for r in sorted(f["ranks"], key=int):
            measured = int(f["ranks"][r]["memory"]["high_water_bytes"].max())
            p = predicted[int(r)]
            err = (measured - p) / p
            worst = max(worst, abs(err))
            lines.append(f"rank {r}: measured {measured} predicted {p} ({100 * err:+.1f}%)")
    assert worst <= tol, "peak memory off by more than %.0f%%:\n  " % (100 * tol) + "\n  ".join(lines)
    return f"peak memory per rank within {100 * worst:.1f}% of the forecast"


CATEGORIES = ["weights", "grads", "optimizer", "activations", "buffers"]


def category_peaks(path):
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        for r in sorted(f["ranks"], key=int):
            m = f["ranks"][r]["memory"][:]
            out[int(r)] = {c: int(m[c + "_bytes"].max()) for c in CATEGORIES + ["total"]}
    return out


def categories(trace, forecast_trace, tol, unasserted=()):
    """Each rank's peak per category (each one's own, over the step) and of the total,
    measured against the forecast's (both traces share one schema). Categories named in
    `unasserted` are printed only (a known gap the caller names)."""
    measured, forecast = category_peaks(trace), category_peaks(forecast_trace)
    bad, lines = [], []
    for r in sorted(measured):
        cells = []
        for c in CATEGORIES + ["total"]:
            a, b = measured[r][c], forecast[r][c]
            err = 0.0 if a == b else (a - b) / b if b else float("inf")
            cells.append(f"{c} {a / 1024:.0f}/{b / 1024:.0f} KiB ({100 * err:+.1f}%)")
            if abs(err) > tol and c not in unasserted:
                bad.append(f"rank {r} {c}")
        lines.append(f"rank {r}: " + ", ".join(cells))
    print("\n".join(lines))
    assert not bad, "measured over forecast off by more than %.0f%%: %s" % (100 * tol, ", ".join(bad))
    return "per-category peaks within %.0f%% of the forecast%s" % (
        100 * tol, " (printed only: %s)" % ", ".join(unasserted) if unasserted else "")

CP_COMM_STREAM = 7  # program.hpp's Stream::cp_comm


def cp_streams(path):
    """Per rank: the context-parallel transfers (name, bytes) in the order of their stream, and
    the attention's compute parts (names), as a trace records them."""
    import h5py
    out = {}
    with h5py.File(path, "r") as f:
        for r in sorted(f["ranks"], key=int):
            ops = sorted(f["ranks"][r]["ops"][:], key=lambda o: (o["start_ns"], o["end_ns"]))
            names = [(o["name"].decode(), int(o["bytes"]), int(o["stream"])) for o in ops]
            out[int(r)] = (
                [(n, b) for n, b, s in names if s == CP_COMM_STREAM],
                [n for n, _, s in names if s != CP_COMM_STREAM and ".attention." in n and
                 ".compute." in n],
            )
    return out


def cp_ops(trace, forecast_trace):
    """The runtime ran the Program's context-parallel schedule: on every rank, the cp transfers
    it issued, in their stream's order and with the bytes it moved, are the forecast's (the
    Program's counts), and so are the attention's compute parts (pre, each core step, post)."""
    measured, forecast = cp_streams(trace), cp_streams(forecast_trace)
    assert sorted(measured) == sorted(forecast), (sorted(measured), sorted(forecast))
    transfers = 0
    for r in measured:
        (mt, mc), (ft, fc) = measured[r], forecast[r]
        assert ft, f"rank {r}: the forecast has no cp transfers"
        for i, (a, b) in enumerate(zip(mt, ft)):
            assert a == b, f"rank {r} cp transfer {i}: ran {a}, the Program's is {b}"
        assert len(mt) == len(ft), f"rank {r}: {len(mt)} cp transfers ran, the Program has {len(ft)}"
        assert mc == fc, f"rank {r}: attention parts ran {mc[:6]}..., the Program's {fc[:6]}..."
        transfers += len(mt)
    return f"the Program's cp schedule ran: {transfers} transfers with their bytes, on {len(measured)} ranks"


if __name__ == "__main__":
    kind, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
    if kind == "cp_ops":
        print(cp_ops(a, b))
        sys.exit(0)
    tol = sys.argv[4] if sys.argv[4] == "derived" else float(sys.argv[4])
    if tol == "derived":
        print({"losses": losses, "weights": weights, "final_loss": final_loss}[kind](a, b, tol, sys.argv[5]))
    elif kind == "categories":  # optional 5th argument: comma-separated categories printed only
        print(categories(a, b, tol, tuple(filter(None, (sys.argv[5:] or [""])[0].split(",")))))
    else:
        print({"losses": losses, "weights": weights, "memory": memory}[kind](a, b, tol))
