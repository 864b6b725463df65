#!/usr/bin/env bash
# Tensor and data parallelism against one rank: the same model, seed, batches and global batch under each
# tp x dp, then one table: how the ranks ran (virtual ranks on one GPU, NCCL on a GPU each, or a process
# each under mpirun), step time, tokens/s per GPU and its ratio to tp 1's (the scaling efficiency where the
# ranks have GPUs of their own), MFU, and how far each run's losses are from tp 1's.
#   bench/tp_sweep.sh MODEL.fb OUTDIR ["TP,DP TP,DP ..."]      (default "1,1 2,1 4,1 8,1 4,2")
# Environment: TPC (default bin/tpc, else build/bin/tpc), ITERS (30 steps), GLOBAL (global batch, 8; each dp
# rank gets GLOBAL/dp sequences a step), MICRO (micro batch; default GLOBAL/dp, less accumulates), PRECISION (bf16), MPI=1 (a process per rank: mpirun -np tp*dp, with
# MPIRUN_ARGS such as --oversubscribe or --hostfile), EXTRA (more tpc run flags), BACKEND (cuda; cpu to try
# the script where there is no GPU). Timing and MFU average the steps from 3 on (the JSONL's device_ms,
# tokens_per_s and mfu).
set -uo pipefail
model="${1:?usage: bench/tp_sweep.sh MODEL.fb OUTDIR [\"TP,DP ...\"]}"
out="${2:?usage: bench/tp_sweep.sh MODEL.fb OUTDIR [\"TP,DP ...\"]}"
configs="${3:-1,1 2,1 4,1 8,1 4,2}"
tpc="${TPC:-$( [ -x bin/tpc ] && echo bin/tpc || echo build/bin/tpc )}"
global="${GLOBAL:-8}"
mkdir -p "$out"
for c in $configs; do
  [[ "$c" =~ ^[1-9][0-9]*,[1-9][0-9]*$ ]] || { echo "tp_sweep: error: '$c' is not TP,DP (e.g. 4,2)" >&2; exit 1; }
  tp="${c%,*}" dp="${c#*,}"
  n=$((tp * dp))
  micro="${MICRO:-$((global / dp))}"
  (( global % (dp * micro) == 0 )) ||
    { echo "tp_sweep: error: GLOBAL=$global does not split into dp $dp x micro batches of $micro: give a multiple of $((dp * micro))" >&2; exit 1; }
  launch=()
  if [ "${MPI:-0}" = 1 ] && [ "$n" -gt 1 ]; then
    # shellcheck disable=SC2206
    launch=(mpirun -np "$n" ${MPIRUN_ARGS:-})
    [ "$(id -u)" = 0 ] && launch+=(--allow-run-as-root)
  fi
  # shellcheck disable=SC2086
  "${launch[@]}" "$tpc" run "$model" --backend "${BACKEND:-cuda}" --precision "${PRECISION:-bf16}" --train-iters "${ITERS:-30}" \
    --log-interval 1 --eval-interval 0 --seed 1 --tp "$tp" --dp "$dp" --micro-batch-size "$micro" --global-batch-size "$global" \
    --log-jsonl "$out/tp${tp}_dp${dp}.jsonl" ${EXTRA:-} > "$out/tp${tp}_dp${dp}.log" 2>&1
  echo "tp $tp x dp $dp: exit $? ($out/tp${tp}_dp${dp}.log)"
done
python3 - "$out" "$configs" <<'PY'
import json, os, re, sys
out, configs = sys.argv[1], sys.argv[2].split()
def rows(name):
    p = os.path.join(out, name + ".jsonl")
    return [r for r in map(json.loads, open(p)) if "loss" in r] if os.path.exists(p) else []
def how(name):
    p = os.path.join(out, name + ".log")
    text = open(p).read() if os.path.exists(p) else ""
    m = re.search(r"on backend (.*)", text)
    if not m: return "failed", 1
    b = m.group(1)
    if b.startswith("cpu"): return "CPU" + (", a process each" if "this process runs" in b else ""), 1
    if "across processes" in b: return "a process each, NCCL", int(re.search(r"of (\d+)", b).group(1))
    if "NCCL" in b: return "a GPU each, NCCL", int(re.search(r"(\d+) ranks", b).group(1))
    if "virtual" in b: return "virtual ranks, 1 GPU", 1
    return "1 GPU", 1
base = rows("tp1_dp1")
def per_gpu(r, gpus):
    late = [x for x in r if x["step"] >= 3] or r
    return sum(x["tokens_per_s"] for x in late) / len(late) / gpus
base_per_gpu = per_gpu(base, 1) if base else 0
print("| tp x dp | ranks run as | step ms | tokens/s per GPU | per GPU vs tp 1 | MFU | max abs loss diff to tp 1 | max rel |")
print("|---|---|---|---|---|---|---|---|")
for c in configs:
    tp, dp = c.split(",")
    name = "tp%s_dp%s" % (tp, dp)
    r, (kind, gpus) = rows(name), how(name)
    if not r:
        print("| %s x %s | %s | | | | | | |" % (tp, dp, kind)); continue
    late = [x for x in r if x["step"] >= 3] or r
    mfu = sum(x.get("mfu", 0) for x in late) / len(late)
    step_ms = sum(x.get("device_ms", 0) for x in late) / len(late)
    if base and len(base) == len(r) and name != "tp1_dp1":
        d = [abs(a["loss"] - b["loss"]) for a, b in zip(r, base)]
        diff = "%.4f (mean %.4f)" % (max(d), sum(d) / len(d))
        rel = "%.1e" % max(x / b["loss"] for x, b in zip(d, base))
    else:
        diff, rel = ("(reference)", "") if name == "tp1_dp1" else ("n/a", "")
    g = per_gpu(r, gpus)
    vs = "%.0f%%" % (100 * g / base_per_gpu) if base_per_gpu else ""
    print("| %s x %s | %s | %.1f | %.0f | %s | %.1f%% | %s | %s |" % (tp, dp, kind, step_ms, g, vs, 100 * mfu, diff, rel))
print("losses over %d steps; tp 1: %.4f -> %.4f" % (len(base), base[0]["loss"], base[-1]["loss"]) if base else "no tp 1 run")
PY
