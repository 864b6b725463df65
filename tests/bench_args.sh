#!/usr/bin/env bash
# bench/vs_pytorch.py refuses bad arguments with one error line naming the flag and exit 1, before it starts
# anything (no GPU or PyTorch needed), and accepts good ones (--dry-run).
#   tests/bench_args.sh SOURCE_DIR TPC_BINARY
set -u
src="$1" tpc="$2"
# The script only checks that the dataset's files exist; empty ones will do.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
data="$tmp/corpus"
touch "$data.bin" "$data.idx"
bench="$src/bench/vs_pytorch.py"
cmd=(python3 "$bench")
source "$(dirname "$0")/expect_error.sh"

ok=(--tpc "$tpc" --data "$data")
expect_error "vs_pytorch: error: --configs: unknown config 'gpt5' (known: tiny, gpt2, gpt2-medium, gpt2-large, gpt2-xl)" \
  "${ok[@]}" --configs gpt2,gpt5
expect_error "--peers: unknown peer 'jax'" "${ok[@]}" --peers eager,jax
expect_error "--warmup=20 must be in [0, --steps - 1) = [0, 9)" "${ok[@]}" --steps 10 --warmup 20
expect_error "--micro-batch=0 must be >= 1" "${ok[@]}" --micro-batch 0
expect_error "--compare=150-300 must be A-B with 1 <= A <= B <= --steps=200" "${ok[@]}" --compare 150-300
expect_error "--compare=late must be A-B" "${ok[@]}" --compare late
expect_error "--tpc /nonexistent/tpc: no executable there" --tpc /nonexistent/tpc --data "$data"
expect_error "--data /nonexistent/corpus: /nonexistent/corpus.bin not found" --tpc "$tpc" --data /nonexistent/corpus
expect_error "argument --steps: invalid int value: 'abc'" "${ok[@]}" --steps abc
expect_error "unrecognized arguments: --fast" "${ok[@]}" --fast

# Good arguments pass the checks.
out="$(python3 "$bench" "${ok[@]}" --configs gpt2 --steps 30 --warmup 5 --dry-run 2>&1)"
if [ $? -ne 0 ] || [[ "$out" != *"would run gpt2"*"30 steps of 16 x 1024"*"loss mean over steps 1-30"* ]]; then
  echo "FAIL: good arguments were refused or misread: $out"
  failures=$((failures + 1))
else
  echo "ok: $out"
fi
[ "$failures" -eq 0 ] || { echo "$failures failures"; exit 1; }
