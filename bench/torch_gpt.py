#!/usr/bin/env python3
"""The PyTorch peer of bench/vs_pytorch.py: GPT-2 written to tpc's model and training step.

Same math as `tpc run` (models/gpt.cpp, passes/autodiff.cpp, runtime/lr_schedule.cpp): learned positions,
pre-LayerNorm blocks (eps from the model file), fused QKV split as [3, heads, head_dim], causal attention
(F.scaled_dot_product_attention, flash under bf16), GELU(tanh), LM head tied to the (padded) token embedding,
mean cross entropy over the real vocabulary only; AdamW (fused) with weight decay on rank >= 2 tensors that
are not biases (so wte and wpe decay, LayerNorm gains and biases do not), global-norm clipping, linear warmup
then cosine/linear decay to min_lr over decay_iters; step `it` (1-based) trains with lr_at(it - 1) and logs
lr_at(it), as tpc (and Megatron-LM's scheduler) do.

Started by vs_pytorch.py, one process per run, so that each run's memory peak is its own. Writes one JSON
object per step (loss, grad_norm, lr, step_s, device_used_bytes) and a summary line to --jsonl.
"""
import argparse
import json
import math
import os
import sys
import time


def fail(msg):
    print(f"torch_gpt: error: {msg}", file=sys.stderr)
    sys.exit(1)


def lr_at(it, cfg):
    """runtime/lr_schedule.cpp, LrSchedule::at: the lr after `it` applied updates."""
    max_lr, min_lr, warmup = cfg["lr"], cfg["min_lr"], cfg["lr_warmup_iters"]
    decay = cfg["lr_decay_iters"] or cfg["train_iters"]
    if warmup > 0 and it <= warmup:
        return max_lr * it / warmup
    if cfg["lr_decay_style"] == "constant":
        return max_lr
    if it > decay or decay <= warmup:
        return min_lr
    ratio = (it - warmup) / (decay - warmup)
    coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0) if cfg["lr_decay_style"] == "cosine" else 1.0 - ratio
    return min_lr + coeff * (max_lr - min_lr)


def read_safetensors(path):
    """The safetensors format by hand (8-byte header length, JSON header, raw little-endian data), so the peer
    needs no package beyond torch."""
    import torch
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "I64": torch.int64}
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        if info["dtype"] not in dtypes:
            fail(f"{path}: tensor {name} has dtype {info['dtype']}, which this reader does not know")
        t = torch.frombuffer(bytearray(raw[base + begin:base + end]), dtype=dtypes[info["dtype"]])
        out[name] = t.reshape(info["shape"])
    return out


def build_model(arch, cfg):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    D, H, L = arch["hidden"], arch["heads"], arch["layers"]
    V = arch["vocab"]
    Vp = arch["padded_vocab"] or (V + 127) // 128 * 128
    eps = arch["layer_norm_eps"]

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(D, 3 * D)
            self.c_proj = nn.Linear(D, D)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.c_attn(x).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4).unbind(0)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).reshape(B, T, D))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(D, 4 * D)
            self.c_proj = nn.Linear(4 * D, D)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(D, eps=eps)
            self.attn = Attn()
            self.ln_2 = nn.LayerNorm(D, eps=eps)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt(nn.Module):
        # Parameter names are tpc's (h.0.attn.c_attn.weight, ...); Linear weights are [out, in], tpc's [in, out].
        def __init__(self):
            super().__init__()
            self.wte = nn.Parameter(torch.empty(Vp, D))
            self.wpe = nn.Parameter(torch.empty(arch["positions"], D))
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(D, eps=eps)

        def forward(self, tokens, targets):
            T = tokens.shape[1]
            x = F.embedding(tokens, self.wte) + self.wpe[:T]
            for block in self.h:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte)[..., :V]  # padded classes stay out of the softmax
            return F.cross_entropy(logits.float().reshape(-1, V), targets.reshape(-1))

    model = Gpt()
    # tpc's initialization scheme (models/gpt.cpp); used only when no --init checkpoint is given.
    std, resid = arch["init_std"], arch["init_std"] / math.sqrt(2.0 * L)
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            nn.init.zeros_(p)
        elif p.dim() == 1:
            nn.init.ones_(p)
        else:
            nn.init.normal_(p, 0.0, resid if name.endswith("c_proj.weight") else std)
    return model


def load_tpc_weights(model, path):
    """A tpc checkpoint's model.safetensors (unsharded layout, tpc's names) into the peer."""
    import torch
    tensors = read_safetensors(path)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in tensors:
                fail(f"{path}: no tensor {name} (is it a checkpoint of this model?)")
            t = tensors[name]
            if p.dim() == 2 and name not in ("wte", "wpe"):
                t = t.t()  # tpc (HF Conv1D) [in, out] -> Linear [out, in]
            if name == "wte" and t.shape[0] < p.shape[0]:
                p.zero_()  # the checkpoint holds the real vocabulary; padding rows never reach the loss
                p[: t.shape[0]].copy_(t)
                continue
            if tuple(t.shape) != tuple(p.shape):
                fail(f"{path}: tensor {name} is {list(t.shape)}, the peer expects {list(p.shape)}")
            p.copy_(t)


def sdpa_choice(torch, B, arch):
    """The SDPA backend PyTorch dispatches this model's causal bf16 attention to (its private chooser; '?' if gone)."""
    try:
        from torch.nn.attention import SDPBackend
        H, Dh = arch["heads"], arch["hidden"] // arch["heads"]
        q = torch.zeros(B, H, 1024, Dh, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        return SDPBackend(torch._fused_sdp_choice(q, q, q, None, 0.0, True)).name.lower()
    except Exception as e:  # noqa: BLE001 (a private API: report, don't fail the run)
        return f"? ({type(e).__name__})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-json", required=True, help="the model file as JSON (tpc new gpt --preset NAME -o X.json)")
    ap.add_argument("--mode", choices=["eager", "compile", "compile-cudnn"], required=True,
                    help="compile-cudnn: torch.compile with SDPA held to cuDNN's attention (the library tpc uses)")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--micro-batch", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batches", help="tpc run --dump-batches file; without it random tokens")
    ap.add_argument("--init", help="model.safetensors of a tpc checkpoint (tpc run --save DIR --save-initial)")
    ap.add_argument("--jsonl", required=True)
    args = ap.parse_args()

    import torch

    spec = json.load(open(args.model_json))
    arch, cfg = spec["arch"], dict(spec["config"])
    cfg["train_iters"] = args.steps  # as tpc run --train-iters STEPS
    B, T, steps = args.micro_batch, args.seq, args.steps
    dev = torch.device("cuda")
    torch.manual_seed(cfg.get("seed", 1234))

    model = build_model(arch, cfg).to(dev)
    if args.init:
        load_tpc_weights(model, args.init)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.endswith("bias")]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.endswith("bias"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr_at(0, cfg), betas=(cfg["adam_beta1"], cfg["adam_beta2"]), eps=cfg["adam_eps"],
                            fused=True)
    params = list(model.parameters())

    if args.batches:
        need = steps * B * (T + 1)
        with open(args.batches, "rb") as f:
            raw = bytearray(f.read(need * 4))
        if len(raw) < need * 4:
            fail(f"{args.batches}: {len(raw) // 4} tokens; {steps} steps of {B} x {T + 1} need {need}")
        windows = torch.frombuffer(raw, dtype=torch.int32).reshape(steps, B, T + 1)  # little-endian, as tpc wrote it
    else:
        windows = torch.randint(0, arch["vocab"], (steps, B, T + 1), dtype=torch.int32)

    if args.mode == "compile-cudnn":
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_math_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(True)
    sdpa = sdpa_choice(torch, B, arch)
    forward = torch.compile(model) if args.mode.startswith("compile") else model  # compiles forward and backward

    def step_fn(tokens, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = forward(tokens, targets)
        loss.backward()
        return loss

    clip = cfg["clip_grad"]
    out = open(args.jsonl, "w")
    torch.cuda.reset_peak_memory_stats()
    device_used = 0
    for it in range(1, steps + 1):
        w = windows[it - 1].to(dev, non_blocking=True).long()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        lr = lr_at(it - 1, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        loss = step_fn(w[:, :-1], w[:, 1:])
        # tpc: grad *= min(1, clip / (norm + 1e-6)), as clip_grad_norm_; clip 0 turns it off.
        norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_v, norm_v = loss.item(), norm.item()  # tpc reads the loss every step too
        dt = time.perf_counter() - t0
        free, total = torch.cuda.mem_get_info()
        device_used = max(device_used, total - free)
        out.write(json.dumps({"step": it, "loss": loss_v, "grad_norm": norm_v, "lr": lr_at(it, cfg), "step_s": dt,
                              "device_used_bytes": total - free}) + "\n")
        out.flush()
    out.write(json.dumps({"summary": True, "max_memory_allocated": torch.cuda.max_memory_allocated(),
                          "max_memory_reserved": torch.cuda.max_memory_reserved(),
                          "device_used_bytes": device_used, "torch": torch.__version__, "sdpa": sdpa,
                          "params": sum(p.numel() for p in params)}) + "\n")
    out.close()


if __name__ == "__main__":
    main()
