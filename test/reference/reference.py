#!/usr/bin/env python3
"""Independent PyTorch reference for stratagem's CPU Transformer (GPT-2 and LLaMA families).

    reference.py IN.h5 OUT.h5

IN.h5 (written by the C++ test):
  attrs  config  JSON: layers, hidden, heads, kv_heads, ffn_hidden, vocab, seq_len, norm,
                 activation, position, tied_embeddings, bias, norm_eps, rope_theta,
                 micro_batches (optional, default 1), moe (optional: experts, top_k,
                 expert_ffn_hidden, shared_experts, dense_layers, router_score,
                 aux_loss_coeff)
  attrs  hyper   JSON: max_lr, min_lr, warmup_steps, total_steps, steps, weight_decay,
                 beta1, beta2, eps, grad_clip
  /params/<name> every parameter, named as in include/stratagem/transformer.hpp
  /tokens, /targets  (B,T) int32
OUT.h5:
  /loss          scalar, mean cross-entropy at the initial weights
  /grads/<name>  gradient of that loss
  /step_losses   (steps,) loss before each AdamW step
  /grad_norms    (steps,) global grad norm before clipping

Written from standard torch ops only (nn.Linear, F.layer_norm, F.gelu, explicit causal
softmax attention, torch.optim.AdamW, clip_grad_norm_), not from the C++ code.
"""
import json
import math
import os
import sys

import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Norm(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c = cfg["hidden"]
        self.kind = cfg["norm"]
        self.eps = cfg["norm_eps"]
        self.weight = nn.Parameter(torch.ones(c))
        has_bias = self.kind == "layernorm" and cfg["bias"]
        self.bias = nn.Parameter(torch.zeros(c)) if has_bias else None

    def forward(self, x):
        if self.kind == "layernorm":
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, self.nh, self.kv = cfg["hidden"], cfg["heads"], cfg["kv_heads"]
        self.hd = c // self.nh
        self.rope = cfg["position"] == "rope"
        self.theta = cfg["rope_theta"]
        self.norm = Norm(cfg)
        self.qkv = nn.Linear(c, (self.nh + 2 * self.kv) * self.hd, bias=cfg["bias"])
        self.proj = nn.Linear(self.nh * self.hd, c, bias=cfg["bias"])

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).split(
            [self.nh * self.hd, self.kv * self.hd, self.kv * self.hd], dim=-1)
        q = q.view(B, T, self.nh, self.hd).transpose(1, 2)  # (B,NH,T,hd)
        k = k.view(B, T, self.kv, self.hd).transpose(1, 2)  # (B,KV,T,hd)
        v = v.view(B, T, self.kv, self.hd).transpose(1, 2)
        if self.rope:
            inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd))
            angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
            angles = torch.cat((angles, angles), dim=-1)
            cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
        group = self.nh // self.kv
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return x + self.proj(y)


class Mlp(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, f = cfg["hidden"], cfg["ffn_hidden"]
        self.swiglu = cfg["activation"] == "swiglu"
        self.norm = Norm(cfg)
        self.fc1 = nn.Linear(c, 2 * f if self.swiglu else f, bias=cfg["bias"])
        self.fc2 = nn.Linear(f, c, bias=cfg["bias"])

    def forward(self, x):
        u = self.fc1(self.norm(x))
        if self.swiglu:
            gate, up = u.chunk(2, dim=-1)
            a = F.silu(gate) * up
        else:
            a = F.gelu(u, approximate="tanh")
        return x + self.fc2(a)


class Ffn(nn.Module):
    """One expert (or the shared experts): fc1 (gate|up) -> silu*up | gelu -> fc2, no bias."""

    def __init__(self, c, f, swiglu):
        super().__init__()
        self.swiglu = swiglu
        self.fc1 = nn.Linear(c, 2 * f if swiglu else f, bias=False)
        self.fc2 = nn.Linear(f, c, bias=False)

    def forward(self, x):
        u = self.fc1(x)
        if self.swiglu:
            gate, up = u.chunk(2, dim=-1)
            return self.fc2(F.silu(gate) * up)
        return self.fc2(F.gelu(u, approximate="tanh"))


class MoeMlp(nn.Module):
    """Top-k routed experts (Mixtral / DeepSeek-V3 normalisation) plus shared experts, with
    Megatron-Core's switch load-balancing loss kept in self.aux after each forward."""

    def __init__(self, cfg):
        super().__init__()
        c, m = cfg["hidden"], cfg["moe"]
        self.m = m
        swiglu = cfg["activation"] == "swiglu"
        self.norm = Norm(cfg)
        self.router = nn.Linear(c, m["experts"], bias=False)
        self.experts = nn.ModuleList(Ffn(c, m["expert_ffn_hidden"], swiglu)
                                     for _ in range(m["experts"]))
        s = m["shared_experts"]
        self.shared = Ffn(c, s * m["expert_ffn_hidden"], swiglu) if s else None
        self.aux = None

    def forward(self, x):
        h = self.norm(x)
        flat = h.reshape(-1, h.shape[-1])
        E, K, N = self.m["experts"], self.m["top_k"], flat.shape[0]
        logits = self.router(flat)
        scores = logits.softmax(-1) if self.m["router_score"] == "softmax" else torch.sigmoid(logits)
        top, chosen = torch.topk(scores, K, dim=-1)
        weights = top / top.sum(-1, keepdim=True) if K > 1 else top
        y = torch.zeros_like(flat)
        for e in range(E):
            token, slot = torch.where(chosen == e)
            if token.numel():
                y = y.index_add(0, token, self.experts[e](flat[token]) * weights[token, slot, None])
        if self.shared is not None:
            y = y + self.shared(flat)
        probs = scores if self.m["router_score"] == "softmax" else scores / scores.sum(-1, keepdim=True)
        counts = torch.bincount(chosen.flatten(), minlength=E).to(scores.dtype)
        self.aux = (probs.sum(0) * counts).sum() * (E * self.m["aux_loss_coeff"] / (N * N * K))
        return x + y.view_as(x)


class Layer(nn.Module):
    def __init__(self, cfg, index):
        super().__init__()
        self.attn = Attention(cfg)
        moe = cfg.get("moe")
        self.mlp = MoeMlp(cfg) if moe and index >= moe["dense_layers"] else Mlp(cfg)

    def forward(self, x):
        return self.mlp(self.attn(x))


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        c, v = cfg["hidden"], cfg["vocab"]
        self.wte = nn.Parameter(torch.zeros(v, c))
        self.wpe = nn.Parameter(torch.zeros(cfg["seq_len"], c)) if cfg["position"] == "learned" else None
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg["layers"]))
        self.norm_f = Norm(cfg)
        self.lm_head = None if cfg["tied_embeddings"] else nn.Linear(c, v, bias=False)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = F.embedding(tokens, self.wte)
        if self.wpe is not None:
            x = x + self.wpe[:T]
        for layer in self.layers:
            x = layer(x)
        x = self.norm_f(x)
        logits = self.lm_head(x) if self.lm_head is not None else F.linear(x, self.wte)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        # MoE layers' load-balancing losses, over this (micro-)batch's tokens.
        return loss + sum(l.mlp.aux for l in self.layers if isinstance(l.mlp, MoeMlp))


def lr_at(step, h):
    """Linear warm-up to max_lr, cosine down to min_lr at total_steps (0-based steps)."""
    if step < h["warmup_steps"]:
        return h["max_lr"] * (step + 1) / h["warmup_steps"]
    if h["total_steps"] <= h["warmup_steps"]:
        return h["max_lr"]
    if step >= h["total_steps"]:
        return h["min_lr"]
    ratio = (step - h["warmup_steps"]) / (h["total_steps"] - h["warmup_steps"])
    return h["min_lr"] + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (h["max_lr"] - h["min_lr"])


def attr_json(f, name):
    v = f.attrs[name]
    return json.loads(v.decode() if isinstance(v, bytes) else str(v))


def main(inp, out):
    torch.manual_seed(0)
    with h5py.File(inp, "r") as f:
        cfg = attr_json(f, "config")
        hyper = attr_json(f, "hyper")
        params = {name: np.array(ds) for name, ds in f["params"].items()}
        tokens = torch.from_numpy(np.array(f["tokens"]).astype(np.int64))
        targets = torch.from_numpy(np.array(f["targets"]).astype(np.int64))

    model = Transformer(cfg)
    named = dict(model.named_parameters())
    if set(named) != set(params):
        sys.exit(f"parameter names differ: only in torch {sorted(set(named) - set(params))}, "
                 f"only in C++ {sorted(set(params) - set(named))}")
    with torch.no_grad():
        for name, p in named.items():
            if tuple(p.shape) != params[name].shape:
                sys.exit(f"{name}: torch shape {tuple(p.shape)} vs C++ {params[name].shape}")
            p.copy_(torch.from_numpy(params[name]))

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hyper["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=hyper["max_lr"], betas=(hyper["beta1"], hyper["beta2"]), eps=hyper["eps"])

    step_losses, grad_norms, first_grads, first_loss = [], [], None, None
    for step in range(hyper["steps"]):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, hyper)
        opt.zero_grad(set_to_none=False)
        # Micro-batches as the runtime runs them (the MoE aux loss is per micro-batch).
        micro = cfg.get("micro_batches", 1)
        loss = 0.0
        for tk, tg in zip(tokens.chunk(micro), targets.chunk(micro)):
            part = model(tk, tg) / micro
            part.backward()
            loss = loss + part.detach()
        if step == 0:
            first_loss = loss.item()
            first_grads = {n: p.grad.detach().clone().numpy() for n, p in model.named_parameters()}
        clip = hyper["grad_clip"]
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip > 0 else float("inf"))
        step_losses.append(loss.item())
        grad_norms.append(float(norm))
        opt.step()

    with h5py.File(out, "w") as f:
        f["loss"] = np.float64(first_loss)
        for name, g in first_grads.items():
            f[f"grads/{name}"] = g.astype(np.float32)
        f["step_losses"] = np.array(step_losses, dtype=np.float64)
        f["grad_norms"] = np.array(grad_norms, dtype=np.float64)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    main(sys.argv[1], sys.argv[2])
