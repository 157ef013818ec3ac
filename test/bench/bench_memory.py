"""Measured against forecast peak memory, per rank and per category at each one's peak.

usage: bench_memory.py NAME RUN.h5 FORECAST.h5
Both traces share one schema (ranks/R/memory: one sample per op, bytes per category).
"""
import sys

import h5py
import numpy as np

CATS = ["weights", "grads", "optimizer", "activations", "buffers"]


def peaks(path):
    out = {}
    with h5py.File(path, "r") as f:
        for r in sorted(f["ranks"], key=int):
            m = f["ranks"][r]["memory"][:]
            i = int(np.argmax(m["total_bytes"]))
            out[int(r)] = {c: int(m[i][c + "_bytes"]) for c in CATS + ["total"]}
    return out


def main():
    name, run, forecast = sys.argv[1:4]
    a, b = peaks(run), peaks(forecast)
    worst = 0.0
    for r in sorted(a):
        m, p = a[r], b[r]
        err = (m["total"] - p["total"]) / p["total"]
        worst = max(worst, abs(err))
        cats = "  ".join(
            f"{c[:3]} {m[c] / 1024:7.0f}/{p[c] / 1024:7.0f}" for c in CATS)
        print(f"  {name:34s} rank {r}  peak {m['total'] / 1024:8.0f} KiB measured / "
              f"{p['total'] / 1024:8.0f} forecast ({100 * err:+5.1f}%)   {cats}")
    return worst


if __name__ == "__main__":
    w = main()
    print(f"  {sys.argv[1]:34s} worst rank {100 * w:.1f}%" + ("" if w <= 0.10 else "  (over 10%)"))
