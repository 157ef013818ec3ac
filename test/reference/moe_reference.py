#!/usr/bin/env python3
"""Independent PyTorch reference for one Mixture-of-Experts FFN (router, top-k, experts,
combine, shared experts, load-balancing loss), forward and backward, in float64.

    moe_reference.py IN.h5 OUT.h5

IN.h5 (written by test_moe_reference.cpp):
  attrs  config  JSON: experts, top_k, router_score ("softmax" | "sigmoid"), activation
                 ("swiglu" | "gelu"), aux_loss_coeff, shared (bool)
  /x (N,C), /dy (N,C)       the FFN's input and the gradient of its output
  /router (E,C), /fc1 (E,2F|F,C), /fc2 (E,C,F), /shared_fc1, /shared_fc2 (when shared)
OUT.h5:
  /y (N,C), /aux (scalar), /experts (N,K) int32 (the top-k, in decreasing score order),
  /grads/{x,router,fc1,fc2,shared_fc1,shared_fc2} of loss = sum(y * dy) + aux.

Written the way Mixtral's and Megatron-Core's PyTorch code does it (torch.topk, a loop over
experts with index_add_, Megatron's switch_load_balancing_loss_func), not from the C++ code.
"""
import json
import sys

import h5py
import numpy as np
import torch
import torch.nn.functional as F


def ffn(x, fc1, fc2, swiglu):
    u = x @ fc1.T
    if swiglu:
        gate, up = u.chunk(2, dim=-1)
        a = F.silu(gate) * up
    else:
        a = F.gelu(u, approximate="tanh")
    return a @ fc2.T


def main(inp, out):
    with h5py.File(inp, "r") as f:
        v = f.attrs["config"]
        cfg = json.loads(v.decode() if isinstance(v, bytes) else str(v))
        t = {name: torch.tensor(np.array(ds), dtype=torch.float64, requires_grad=name != "dy")
             for name, ds in f.items()}
    E, K = cfg["experts"], cfg["top_k"]
    swiglu = cfg["activation"] == "swiglu"
    x = t["x"]
    N = x.shape[0]

    logits = x @ t["router"].T
    if cfg["router_score"] == "softmax":
        scores = logits.softmax(dim=-1)
    else:
        scores = torch.sigmoid(logits)
    top, experts = torch.topk(scores, K, dim=-1)  # sorted, decreasing
    weights = top / top.sum(dim=-1, keepdim=True) if K > 1 else top

    y = torch.zeros_like(x)
    for e in range(E):
        token, slot = torch.where(experts == e)
        if token.numel() == 0:
            continue
        out_e = ffn(x[token], t["fc1"][e], t["fc2"][e], swiglu)
        y = y.index_add(0, token, out_e * weights[token, slot].unsqueeze(-1))
    if cfg["shared"]:
        y = y + ffn(x, t["shared_fc1"], t["shared_fc2"], swiglu)

    # Megatron-Core's switch_load_balancing_loss_func (sigmoid scores normalised per token).
    probs = scores if cfg["router_score"] == "softmax" else scores / scores.sum(-1, keepdim=True)
    tokens_per_expert = torch.bincount(experts.flatten(), minlength=E).to(torch.float64)
    aux = (probs.sum(0) * tokens_per_expert).sum() * (E * cfg["aux_loss_coeff"] / (N * N * K))

    loss = (y * t["dy"]).sum() + aux
    loss.backward()
    with h5py.File(out, "w") as f:
        f["y"] = y.detach().numpy()
        f["aux"] = np.float64(aux.item())
        f["experts"] = experts.numpy().astype(np.int32)
        for name in ("x", "router", "fc1", "fc2", "shared_fc1", "shared_fc2"):
            if name in t:
                f[f"grads/{name}"] = t[name].grad.numpy()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])
