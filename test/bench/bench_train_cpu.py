#!/usr/bin/env python3
"""PyTorch side of the CPU training benchmark: tokens/s of fwd + bwd + AdamW on gpt2-124m.

    /usr/bin/python3 test/bench/bench_train_cpu.py --batch 4 --seq 1024 --threads 2

Uses the same model definition as the reference test (test/reference/reference.py: explicit
causal softmax attention, tanh GELU, tied head), fp32, torch.optim.AdamW with clipping, so
the comparison with `stratagem`'s CPU backend is like for like. Prints one JSON object.
"""
import argparse
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from reference import Transformer  # noqa: E402

GPT2_124M = dict(layers=12, hidden=768, heads=12, kv_heads=12, ffn_hidden=3072, vocab=50257,
                 seq_len=1024, norm="layernorm", activation="gelu", position="learned",
                 tied_embeddings=True, bias=True, norm_eps=1e-5, rope_theta=10000.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3, help="timed steps")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    ap.add_argument("--layers", type=int, default=None, help="override (quick runs)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = dict(GPT2_124M)
    if args.layers is not None:
        cfg["layers"] = args.layers
    if args.seq > cfg["seq_len"]:
        sys.exit(f"--seq {args.seq} exceeds the model's {cfg['seq_len']}")
    model = Transformer(cfg)
    with torch.no_grad():  # GPT-2 init; values do not change the timing, NaNs would
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif name.endswith("norm.weight") or name == "norm_f.weight":
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    tokens = torch.randint(0, cfg["vocab"], (args.batch, args.seq))
    targets = torch.randint(0, cfg["vocab"], (args.batch, args.seq))

    times, losses = [], []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= args.warmup:
            times.append(dt)
            losses.append(loss.item())

    step_s = sum(times) / len(times)
    print(json.dumps({
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "model": "gpt2-124m" if args.layers is None else f"gpt2-124m-{cfg['layers']}l",
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch": args.batch,
        "seq": args.seq,
        "threads": args.threads,
        "steps": args.steps,
        "step_s": step_s,
        "step_s_min": min(times),
        "tokens_per_s": args.batch * args.seq / step_s,
        "loss": losses[-1],
        "machine": platform.processor() or platform.machine(),
    }))


if __name__ == "__main__":
    main()
