#!/usr/bin/env python3
"""How far PyTorch's flash attention (SDPA's FLASH_ATTENTION backend: bf16, one 16-bit P) lands from exact
attention, on the inputs and in the metric of tpc's kernel tests (tests/unit/cuda_kernel_cases.h): q, k, v and
dout uniform in [-1, 1) rounded to bf16, causal, scale 1/sqrt(head_dim); per result the worst
|got - exact| / (|exact| + rms(exact)). The exact results are computed in float64 from the same bf16 inputs.
This is the yardstick for the tolerance tpc's tensor-core kernels with one 16-bit P are held to.

    python3 bench/attention_numerics.py [--seeds 5]
"""
import argparse
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [  # (name, B, H, T, D): the kernel tests' tensor-core attention cases
    ("tc causal bf16 D64 T1024", 2, 3, 1024, 64),
    ("tc causal bf16 D128 T1024", 2, 2, 1024, 128),
    ("tc causal bf16 D128 T77", 2, 2, 77, 128),
    ("gpt2 layer [16,12,1024,64]", 16, 12, 1024, 64),
]


def worst(got, exact):
    g, w = got.double(), exact.double()
    rms = w.pow(2).mean().sqrt()
    return ((g - w).abs() / (w.abs() + rms + 1e-30)).max().item()


def exact_attention(q, k, v, dout):
    q, k, v, dout = (t.double().detach().requires_grad_(True) for t in (q, k, v, dout))
    T, D = q.shape[-2], q.shape[-1]
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    p = s.masked_fill(mask, float("-inf")).softmax(-1)
    out = p @ v
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out, dq, dk, dv


def flash_attention(q, k, v, dout):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    return out, dq, dk, dv


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=5)
    a = ap.parse_args()
    print(f"{'case':30} {'out':>9} {'dq':>9} {'dk':>9} {'dv':>9}   (worst over {a.seeds} seeds)")
    for name, B, H, T, D in SHAPES:
        worst_of = [0.0] * 4
        for seed in range(a.seeds):
            g = torch.Generator(device="cuda").manual_seed(seed)
            q, k, v, dout = ((torch.rand(B, H, T, D, generator=g, device="cuda") * 2 - 1).bfloat16() for _ in range(4))
            exact = exact_attention(q, k, v, dout)
            got = flash_attention(q, k, v, dout)
            worst_of = [max(x, worst(gt, ex)) for x, gt, ex in zip(worst_of, got, exact)]
        print(f"{name:30} " + " ".join(f"{x:9.2e}" for x in worst_of))


if __name__ == "__main__":
    main()
