#!/usr/bin/env python3
"""tpc against a PyTorch peer (eager and torch.compile) on the same GPT-2, batch, sequence and precision.

For each config: `tpc new gpt --preset NAME -o model.json` gives the model and its hyper-parameters; tpc trains
it (cold kernel cache, then a short warm run for the warm compile time) dumping its batches and writing its
initial weights (--dump-batches, --save-initial); the peer (bench/torch_gpt.py) starts from those weights and
reads those batches. Prints one table (step time, tokens/s, MFU, memory, ratios, compile times) and the loss
agreement. See bench/README.md. Argument checks come before anything starts (and need no PyTorch).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

PRESETS = ["tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]
PEERS = ["eager", "compile", "compile-cudnn"]
PEAK_BF16 = 989e12  # H200 dense bf16, the peak tpc's MFU divides by (tools/run.cpp)
HERE = os.path.dirname(os.path.abspath(__file__))


def fail(msg):
    print(f"vs_pytorch: error: {msg}", file=sys.stderr)
    sys.exit(1)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 1 (argparse's default is usage + exit 2)
        fail(f"{message} (see --help)")


def parse_args(argv):
    ap = Parser(description="tpc vs PyTorch eager / torch.compile: speed, memory, and the same math over the first steps")
    ap.add_argument("--tpc", default="build/bin/tpc", help="the tpc binary, built with -DTPC_CUDA=ON (default build/bin/tpc)")
    ap.add_argument("--configs", default="gpt2,gpt2-medium", help=f"comma-separated presets of {', '.join(PRESETS)}")
    ap.add_argument("--peers", default="eager,compile",
                    help="comma-separated of eager, compile, compile-cudnn (torch.compile with SDPA held to cuDNN); "
                         "'none' for tpc alone")
    ap.add_argument("--steps", type=int, default=200, help="training steps per run (default 200)")
    ap.add_argument("--warmup", type=int, default=20, help="steps left out of the timing (default 20)")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--data", default="data/brown/brown_gpt2",
                    help="indexed dataset prefix (PREFIX.bin/.idx, GPT-2 BPE; default data/brown/brown_gpt2)")
    ap.add_argument("--compare", default="",
                    help="steps A-B over which the mean loss difference is taken (default: the last 50 steps, 150-200 at 200)")
    ap.add_argument("--out", default="bench-out", help="folder for logs, batches and checkpoints (default bench-out)")
    ap.add_argument("--dry-run", action="store_true", help="check the arguments, print the plan, start nothing")
    a = ap.parse_args(argv)

    a.configs = [c for c in a.configs.split(",") if c]
    for c in a.configs:
        if c not in PRESETS:
            fail(f"--configs: unknown config '{c}' (known: {', '.join(PRESETS)})")
    if not a.configs:
        fail("--configs is empty: name at least one of " + ", ".join(PRESETS))
    a.peers = [] if a.peers == "none" else [p for p in a.peers.split(",") if p]
    for p in a.peers:
        if p not in PEERS:
            fail(f"--peers: unknown peer '{p}' (known: eager, compile, compile-cudnn, or none)")
    for name in ("steps", "micro_batch", "seq"):
        if getattr(a, name) < 1:
            fail(f"--{name.replace('_', '-')}={getattr(a, name)} must be >= 1")
    if a.warmup < 0 or a.warmup >= a.steps - 1:
        fail(f"--warmup={a.warmup} must be in [0, --steps - 1) = [0, {a.steps - 1}): the timing needs steps after it")
    if a.compare:
        m = re.fullmatch(r"(\d+)-(\d+)", a.compare)
        if not m or not (1 <= int(m.group(1)) <= int(m.group(2)) <= a.steps):
            fail(f"--compare={a.compare} must be A-B with 1 <= A <= B <= --steps={a.steps}, e.g. 150-200")
        a.compare = (int(m.group(1)), int(m.group(2)))
    else:
        a.compare = (max(1, a.steps - 50), a.steps)
    if not (os.path.isfile(a.tpc) and os.access(a.tpc, os.X_OK)):
        fail(f"--tpc {a.tpc}: no executable there (build it with -DTPC_CUDA=ON, or give its path)")
    for ext in (".bin", ".idx"):
        if not os.path.isfile(a.data + ext):
            fail(f"--data {a.data}: {a.data}{ext} not found (scripts/fetch_data.sh prepares data/brown/brown_gpt2)")
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        fail(f"--out {a.out} is a file; give a folder")
    return a


def run(cmd, log, env=None):
    """Runs cmd with its output to log; fails naming the log when it fails."""
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        tail = open(log).read().splitlines()[-5:]
        fail(f"{cmd[0]} exited {rc}; see {log}:\n  " + "\n  ".join(tail))
    return open(log).read()


def read_jsonl(path):
    return [json.loads(l) for l in open(path) if l.strip()]


def mib(text):
    return float(text) * (1 << 20)


def tpc_runs(a, cfg_name, d, spec, flags):
    """tpc cold (empty kernel cache: timing, dump, initial weights), then warm (compile time only)."""
    cache = os.path.join(d, "kernel-cache")
    shutil.rmtree(cache, ignore_errors=True)
    env = dict(os.environ, TPC_CACHE_DIR=cache)
    common = [a.tpc, "run", os.path.join(d, "model.json"), "--backend", "cuda", "--precision", "bf16",
              "--data-path", a.data, "--eval-interval", "0"] + flags
    ck = os.path.join(d, "ck")
    shutil.rmtree(ck, ignore_errors=True)
    t0 = time.time()
    cold = run(common + ["--train-iters", str(a.steps), "--log-interval", "1", "--log-jsonl", os.path.join(d, "tpc.jsonl"),
                         "--dump-batches", os.path.join(d, "batches.i32"), "--save", ck, "--save-initial"],
               os.path.join(d, "tpc_cold.log"), env)
    cold_wall = time.time() - t0
    warm = run(common + ["--train-iters", "2", "--log-interval", "1"], os.path.join(d, "tpc_warm.log"), env)
    r = {"cold_wall_s": cold_wall}
    for key, text in (("cold", cold), ("warm", warm)):
        m = re.search(r"kernels: (\d+) compiled by NVRTC in ([\d.]+)s, (\d+) from the cache .*; prepared in ([\d.]+)s", text)
        if not m:
            fail(f"{d}/tpc_{key}.log: no 'prepared in' line from the CUDA backend (is {a.tpc} built with -DTPC_CUDA=ON?)")
        r[key] = {"compiled": int(m.group(1)), "nvrtc_s": float(m.group(2)), "cached": int(m.group(3)),
                  "prepare_s": float(m.group(4))}
    m = re.search(r"activations arena ([\d.]+) MiB.*?state ([\d.]+) MiB(?: \((?:and as much|and [\d.]+ MiB of it) kept for non-finite steps\))?, batch ([\d.]+) MiB, cuBLASLt workspace ([\d.]+) MiB",
                  cold)
    if not m:
        fail(f"{d}/tpc_cold.log: no memory plan line")
    r["arena"], r["state"], r["batch"], r["workspace"] = (mib(x) for x in m.groups())
    m = re.search(r": (\d+) parameters, training step", cold)
    r["params"] = int(m.group(1))
    r["launches"] = int(re.search(r"GPU: (\d+) kernel launches", cold).group(1)) if "kernel launches" in cold else -1
    m = re.search(r"attention through (cuDNN [\d.]+) fused flash attention", cold)
    r["attention"] = m.group(1) if m else "tpc's tensor-core kernels"
    # tpc's own split of its step (runtime/trainer.cpp): the device's time per step and the wall time per step.
    m = re.search(r"time per step \(steps \d+-\d+\): ([\d.]+) ms; the device ran ([\d.]+) ms", cold)
    r["device_split"] = (float(m.group(1)), float(m.group(2))) if m else None
    steps = [s for s in read_jsonl(os.path.join(d, "tpc.jsonl")) if "loss" in s and s.get("loss") is not None]
    r["losses"] = {s["step"]: s["loss"] for s in steps}
    el = {s["step"]: s["elapsed_s"] for s in steps}
    # Time from the end of step `warmup` to the end of step steps-1 (the last step also writes the checkpoint).
    first, last = a.warmup if a.warmup > 0 else 1, a.steps - 1
    if first not in el or last not in el or last <= first:
        fail(f"{d}/tpc.jsonl: steps {first} and {last} are not both logged")
    r["step_s"] = (el[last] - el[first]) / (last - first)
    r["device_used"] = max((s.get("gpu_memory_bytes", 0) for s in steps), default=0)
    shutil.rmtree(ck + "/iter_%07d" % a.steps, ignore_errors=True)  # keep iteration 0 only: the peer's start
    return r


def peer_run(a, mode, d, init):
    log = os.path.join(d, f"torch_{mode}.jsonl")
    t0 = time.time()
    run([sys.executable, os.path.join(HERE, "torch_gpt.py"), "--model-json", os.path.join(d, "model.json"),
         "--mode", mode, "--steps", str(a.steps), "--micro-batch", str(a.micro_batch), "--seq", str(a.seq),
         "--batches", os.path.join(d, "batches.i32"), "--init", init, "--jsonl", log],
        os.path.join(d, f"torch_{mode}.log"), dict(os.environ))
    wall = time.time() - t0
    rows = read_jsonl(log)
    summary = next(x for x in rows if x.get("summary"))
    steps = [x for x in rows if "step" in x]
    timed = [x["step_s"] for x in steps if a.warmup < x["step"] < a.steps]
    return {"wall_s": wall, "step_s": statistics.mean(timed), "first_step_s": steps[0]["step_s"],
            "losses": {x["step"]: x["loss"] for x in steps}, **summary}


def gib(b):
    return f"{b / (1 << 30):.2f}"


def report(a, cfg_name, tpc, peers):
    tokens = a.micro_batch * a.seq
    spec = json.load(open(os.path.join(a.out, cfg_name, "model.json")))["arch"]
    # tpc's MFU formula (tools/run.cpp) for every column: 6 N + 12 L D T FLOPs per token, N counting the padded wte.
    flops = 6.0 * tpc["params"] + 12.0 * spec["layers"] * spec["hidden"] * a.seq
    cols = [("tpc", tpc["step_s"])] + [(f"torch {m}", p["step_s"]) for m, p in peers.items()]
    print(f"\n{cfg_name}: {tpc['params'] / 1e6:.1f}M parameters, micro batch {a.micro_batch} x seq {a.seq}, bf16; "
          f"timing over steps {a.warmup + 1}-{a.steps - 1} of {a.steps}")
    print(f"{'':34}" + "".join(f"{n:>16}" for n, _ in cols))
    print(f"{'step time (ms)':34}" + "".join(f"{1e3 * s:>16.1f}" for _, s in cols))
    print(f"{'tokens/s':34}" + "".join(f"{tokens / s:>16,.0f}" for _, s in cols))
    print(f"{'MFU (of 989 TFLOP/s bf16)':34}" + "".join(f"{100 * tokens / s * flops / PEAK_BF16:>15.1f}%" for _, s in cols))
    print(f"{'tpc speed / this':34}" + "".join(f"{s / tpc['step_s']:>15.2f}x" for _, s in cols))
    print(f"{'GPU used, cudaMemGetInfo (GiB)':34}{gib(tpc['device_used']):>16}" +
          "".join(f"{gib(p['device_used_bytes']):>16}" for p in peers.values()))
    planned = tpc["arena"] + tpc["state"] + tpc["batch"] + tpc["workspace"]
    print(f"{'tensors: tpc plan / torch max alloc':34}{gib(planned):>16}" +
          "".join(f"{gib(p['max_memory_allocated']):>16}" for p in peers.values()))
    print(f"{'torch max_memory_reserved (GiB)':34}{'':>16}" + "".join(f"{gib(p['max_memory_reserved']):>16}" for p in peers.values()))
    print(f"{'tpc memory / this (cudaMemGetInfo)':34}{'1.00x':>16}" +
          "".join(f"{tpc['device_used'] / p['device_used_bytes']:>15.2f}x" for p in peers.values()))
    if tpc.get("device_split"):
        wall, dev = tpc["device_split"]
        print(f"  tpc step split (steps 3-{a.steps}): the device ran {dev:.2f} of {wall:.2f} ms a step ({100 * dev / wall:.1f}%), "
              f"the rest is host time the GPU waits for")
    print(f"  tpc plan: activations arena {gib(tpc['arena'])} + parameters and AdamW state {gib(tpc['state'])} + batch "
          f"{gib(tpc['batch'])} + cuBLASLt workspace {gib(tpc['workspace'])} GiB; {tpc['launches']} launches per step")
    print(f"  memory: 'GPU used' is total - free from cudaMemGetInfo, the most seen after a step, in both (it counts the "
          f"CUDA context and libraries): the comparable figure. tpc's plan and torch's max_memory_allocated count tensor "
          f"bytes only; max_memory_reserved is what torch's caching allocator held.")
    c, w = tpc["cold"], tpc["warm"]
    print(f"  tpc compile: cold {c['prepare_s']:.1f}s ({c['compiled']} kernels by NVRTC in {c['nvrtc_s']:.1f}s), warm "
          f"{w['prepare_s']:.1f}s ({w['cached']} from the cache); 'prepared in' of the CUDA backend")
    if "compile" in peers:
        p = peers["compile"]
        print(f"  torch.compile: first step {p['first_step_s']:.1f}s (compile + one step); torch {p['torch']}")
    print("  attention: tpc " + tpc["attention"] + "".join(f"; torch {m} SDPA {p.get('sdpa', '?')}" for m, p in peers.items()))
    for m, p in peers.items():
        common = sorted(set(tpc["losses"]) & set(p["losses"]))
        diffs = {s: abs(tpc["losses"][s] - p["losses"][s]) for s in common}
        lo, hi = a.compare
        window = [s for s in common if lo <= s <= hi]
        if not diffs or not window:
            print(f"  loss vs torch {m}: no common steps")
            continue
        print(f"  loss vs torch {m} (same initial weights, same batches): max |tpc - torch| {max(diffs.values()):.4f} "
              f"over steps 1-{common[-1]}; steps {lo}-{hi}: mean |diff| {statistics.mean(diffs[s] for s in window):.4f}, "
              f"mean loss tpc {statistics.mean(tpc['losses'][s] for s in window):.4f} torch "
              f"{statistics.mean(p['losses'][s] for s in window):.4f}; step 1: {tpc['losses'][common[0]]:.4f} vs "
              f"{p['losses'][common[0]]:.4f}")


def main(argv):
    a = parse_args(argv)
    if a.dry_run:
        print(f"vs_pytorch: would run {', '.join(a.configs)}: tpc {a.tpc} and torch {', '.join(a.peers) or '(none)'}, "
              f"{a.steps} steps of {a.micro_batch} x {a.seq} on {a.data} (timing after step {a.warmup}, loss mean over "
              f"steps {a.compare[0]}-{a.compare[1]}), logs in {a.out}")
        return
    os.makedirs(a.out, exist_ok=True)
    results = {}
    for cfg_name in a.configs:
        d = os.path.join(a.out, cfg_name)
        os.makedirs(d, exist_ok=True)
        run([a.tpc, "new", "gpt", "--preset", cfg_name, "-o", os.path.join(d, "model.json")], os.path.join(d, "new.log"))
        spec = json.load(open(os.path.join(d, "model.json")))
        flags = ["--micro-batch-size", str(a.micro_batch), "--global-batch-size", str(a.micro_batch),
                 "--seq-length", str(a.seq)]
        print(f"[{cfg_name}] tpc ...", flush=True)
        tpc = tpc_runs(a, cfg_name, d, spec, flags)
        peers = {}
        init = os.path.join(d, "ck", "iter_0000000", "model.safetensors")
        for mode in a.peers:
            print(f"[{cfg_name}] torch {mode} ...", flush=True)
            peers[mode] = peer_run(a, mode, d, init)
        results[cfg_name] = (tpc, peers)
    for cfg_name, (tpc, peers) in results.items():
        report(a, cfg_name, tpc, peers)


if __name__ == "__main__":
    main(sys.argv[1:])
