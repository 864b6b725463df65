#!/usr/bin/env bash
# Issue 10's runs on a machine of several GPUs (bench/tp_sweep.sh does each table):
#   equivalence  gpt2-medium, bf16, 30 steps, global batch 8: tp 1, 2, 4, 8 and 4 x 2 through NCCL against tp 1,
#                then the same as a process per rank (mpirun), whose losses must equal the one-process runs' bit
#                for bit.
#   scaling      gpt-6.7b (tp 1, 2, 4, 8, 2 x 4, 4 x 2) and gpt2-xl (25 heads: dp 1, 2, 4, 8), tokens/s per GPU
#                against tp 1 and MFU, with the collectives on a stream of their own (overlapping compute) and
#                without (--one-stream).
#   scripts/multi_gpu_check.sh OUTDIR
# Environment: PARTS ("equivalence scaling"), TPC (bin/tpc, else build/bin/tpc), MODELS (the folder of the model
# files: models, else build/models), GPUS (default: nvidia-smi's count; configurations needing more are left
# out), ITERS_SCALE (10), BACKEND/PRECISION (passed to tp_sweep.sh: BACKEND=cpu tries the script without GPUs).
set -uo pipefail
out="${1:?usage: scripts/multi_gpu_check.sh OUTDIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sweep="$here/bench/tp_sweep.sh"
export TPC="${TPC:-$( [ -x bin/tpc ] && echo bin/tpc || echo build/bin/tpc )}"
models="${MODELS:-$( [ -d models ] && [ -e models/gpt2.fb ] && echo models || echo build/models )}"
gpus="${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}"
mkdir -p "$out"
fits() {  # the configurations of "$@" (TP,DP) that need at most $gpus GPUs
  local c r=()
  for c in "$@"; do (( ${c%,*} * ${c#*,} <= gpus )) && r+=("$c"); done
  echo "${r[*]}"
}
echo "== multi-GPU check: $gpus GPUs, $TPC, models in $models, logs in $out"
[ "$gpus" -ge 1 ] || { echo "multi_gpu_check: error: no GPU here (set GPUS and BACKEND=cpu to try the script)" >&2; exit 1; }

if [[ " ${PARTS:-equivalence scaling} " == *" equivalence "* ]]; then
  configs="$(fits 1,1 2,1 4,1 8,1 4,2)"
  echo; echo "== gpt2-medium, one process (NCCL on a GPU per rank where there are enough GPUs): $configs"
  bash "$sweep" "$models/gpt2-medium.fb" "$out/eq_one" "$configs" | grep -E '^\||^losses'
  echo; echo "== gpt2-medium, a process per rank (mpirun)"
  MPI=1 bash "$sweep" "$models/gpt2-medium.fb" "$out/eq_mpi" "$configs" | grep -E '^\||^losses'
  echo; echo "== a process per rank against one process (losses and grad norms, bit for bit)"
  for c in $configs; do
    n="tp${c%,*}_dp${c#*,}"
    python3 - "$out/eq_one/$n.jsonl" "$out/eq_mpi/$n.jsonl" "$n" <<'PY'
import json, os, sys
def rows(p):
    return [(r["loss"], r["grad_norm"]) for r in map(json.loads, open(p)) if "loss" in r] if os.path.exists(p) else []
a, b = rows(sys.argv[1]), rows(sys.argv[2])
print("%-10s %s" % (sys.argv[3], "identical over %d steps" % len(a) if a and a == b else "DIFFERENT (%d vs %d steps)" % (len(a), len(b))))
PY
  done
fi

if [[ " ${PARTS:-equivalence scaling} " == *" scaling "* ]]; then
  for overlap in on off; do
    extra=""; [ $overlap = off ] && extra="--one-stream"
    configs="$(fits 1,1 2,1 4,1 8,1 2,4 4,2)"
    echo; echo "== gpt-6.7b, micro batch 1, global batch 8, overlap $overlap: $configs"
    EXTRA="$extra" ITERS="${ITERS_SCALE:-10}" MICRO=1 GLOBAL=8 bash "$sweep" "$models/gpt-6.7b.fb" "$out/scale_6b7_$overlap" "$configs" |
      grep -E '^\||^losses'
    configs="$(fits 1,1 1,2 1,4 1,8)"
    echo; echo "== gpt2-xl, global batch 16, overlap $overlap: $configs"
    EXTRA="$extra" ITERS="${ITERS_SCALE:-10}" GLOBAL=16 bash "$sweep" "$models/gpt2-xl.fb" "$out/scale_xl_$overlap" "$configs" |
      grep -E '^\||^losses'
  done
fi
