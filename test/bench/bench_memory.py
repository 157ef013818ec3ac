"""Measured against forecast peak memory, per rank: each category's own peak over the step
(weights, grads, optimizer, activations, buffers) and the total's, KiB, measured/forecast.

usage: bench_memory.py NAME RUN.h5 FORECAST.h5
Both traces share one schema (ranks/R/memory: one sample per op or memory event, bytes per
category). The test (test/runtime/memory_forecast.sh) asserts 10% on every category and on the
total (buffers printed only on the plans it names as known gaps).
"""
import sys

import h5py

CATS = ["weights", "grads", "optimizer", "activations", "buffers"]


def peaks(path):
    out = {}
    with h5py.File(path, "r") as f:
        for r in sorted(f["ranks"], key=int):
            m = f["ranks"][r]["memory"][:]
            out[int(r)] = {c: int(m[c + "_bytes"].max()) for c in CATS + ["total"]}
    return out


def err(a, b):
    return 0.0 if a == b else (a - b) / b if b else float("inf")


def main():
    name, run, forecast = sys.argv[1:4]
    a, b = peaks(run), peaks(forecast)
    worst, worst_cat = 0.0, 0.0
    for r in sorted(a):
        m, p = a[r], b[r]
        e = err(m["total"], p["total"])
        worst = max(worst, abs(e))
        for c in CATS[:4]:
            worst_cat = max(worst_cat, abs(err(m[c], p[c])))
        cats = "  ".join(
            f"{c[:3]} {m[c] / 1024:5.0f}/{p[c] / 1024:5.0f} ({100 * err(m[c], p[c]):+4.0f}%)"
            for c in CATS)
        print(f"  {name:30s} r{r}  peak {m['total'] / 1024:5.0f}/{p['total'] / 1024:5.0f} KiB "
              f"({100 * e:+5.1f}%)   {cats}")
    return worst, worst_cat


if __name__ == "__main__":
    w, wc = main()
    print(f"  {sys.argv[1]:30s} worst rank: total {100 * w:.1f}%, weights/grads/optimizer/"
          f"activations {100 * wc:.1f}%" + ("" if max(w, wc) <= 0.10 else "  (over 10%)"))
