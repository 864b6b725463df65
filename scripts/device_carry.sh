#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh needs on a GPU machine that has CUDA but no build tools: the stripped
# tpc and tpc_gpu_tests of a CUDA-ON build, the model files, the GPT-2 Brown corpus, the scripts and bench/.
#   scripts/device_carry.sh BUILD_DIR OUT_DIR     (then on the GPU machine, from OUT_DIR:
#   TPC_BUILD=. TPC_DATA_DIR=$PWD/data bash scripts/gpu_check.sh LOGDIR)
set -euo pipefail
build="${1:?usage: scripts/device_carry.sh BUILD_DIR OUT_DIR}"
out="${2:?usage: scripts/device_carry.sh BUILD_DIR OUT_DIR}"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
for f in "$build/bin/tpc" "$build/tests/tpc_gpu_tests" "$build/models/tiny.fb" "$build/models/gpt2.fb"; do
  [ -e "$f" ] || { echo "device_carry: error: $f is missing (build tpc, tpc_gpu_tests and tpc_model_files with -DTPC_CUDA=ON)" >&2; exit 1; }
done
rm -rf "$out"
mkdir -p "$out/bin" "$out/tests" "$out/models" "$out/scripts" "$out/bench" "$out/data/brown" "$out/data/gpt2"
strip -o "$out/bin/tpc" "$build/bin/tpc"
strip -o "$out/tests/tpc_gpu_tests" "$build/tests/tpc_gpu_tests"
[ -e "$build/bin/tpc_gemm_bench" ] && strip -o "$out/bin/tpc_gemm_bench" "$build/bin/tpc_gemm_bench"
cp "$build"/models/*.fb "$out/models/"
data="${TPC_DATA_DIR:-$src/data}"
cp "$data"/brown/brown_gpt2.{bin,idx} "$data"/brown/brown_byte.{bin,idx} "$out/data/brown/"
cp "$data"/gpt2/encoder.json "$data"/gpt2/vocab.bpe "$out/data/gpt2/"
cp "$src"/scripts/gpu_check.sh "$src"/scripts/multi_gpu_check.sh "$src"/scripts/check_hf_export.py "$out/scripts/"
cp "$src"/bench/*.py "$src"/bench/*.sh "$out/bench/"
du -sh "$out"
