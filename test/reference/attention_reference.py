#!/usr/bin/env python3
"""PyTorch reference for causal attention with grouped key/value heads, for the context-parallel
attention test (test_cp_attention.cpp).

    attention_reference.py DIR

DIR/dims.json: B, T, heads, kv_heads, head_dim. DIR/qkv.f32 (B,T,(NH+2KV)*hd) and
DIR/dout.f32 (B,T,NH*hd), raw little-endian float32. Writes DIR/out.f32 (B,T,NH*hd),
DIR/lse.f32 (B,NH,T) and DIR/dqkv.f32 (B,T,(NH+2KV)*hd), the gradient of sum(out * dout).

One causal attention over the whole sequence (an explicit masked softmax: the installed torch
predates scaled_dot_product_attention), in float64 so that the reference's own rounding stays far below the
tolerance; written from torch ops, not from the C++ code.
"""
import json
import os
import sys

import numpy as np
import torch


def main(folder):
    with open(os.path.join(folder, "dims.json")) as f:
        d = json.load(f)
    B, T, nh, kv, hd = d["B"], d["T"], d["heads"], d["kv_heads"], d["head_dim"]
    width = (nh + 2 * kv) * hd
    qkv = np.fromfile(os.path.join(folder, "qkv.f32"), dtype="<f4").reshape(B, T, width)
    dout = np.fromfile(os.path.join(folder, "dout.f32"), dtype="<f4").reshape(B, T, nh * hd)
    qkv = torch.tensor(qkv, dtype=torch.float64, requires_grad=True)
    q, k, v = qkv.split([nh * hd, kv * hd, kv * hd], dim=-1)
    q = q.reshape(B, T, nh, hd).transpose(1, 2)
    k = k.reshape(B, T, kv, hd).transpose(1, 2).repeat_interleave(nh // kv, dim=1)
    v = v.reshape(B, T, kv, hd).transpose(1, 2).repeat_interleave(nh // kv, dim=1)
    scores = (q @ k.transpose(-1, -2)) / hd**0.5  # (B,NH,T,T)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (B,NH,T)
    out = torch.softmax(scores, dim=-1) @ v  # (B,NH,T,hd)
    out = out.transpose(1, 2).reshape(B, T, nh * hd)
    (out * torch.tensor(dout, dtype=torch.float64)).sum().backward()
    for name, t in (("out", out), ("lse", lse), ("dqkv", qkv.grad)):
        t.detach().numpy().astype("<f4").tofile(os.path.join(folder, name + ".f32"))


if __name__ == "__main__":
    main(sys.argv[1])
