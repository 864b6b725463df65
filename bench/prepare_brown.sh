#!/usr/bin/env bash
# Times `tpc prepare` over the Brown corpus (GPT-2 BPE, --workers 2) and prints the time and tokens/s.
# Not a test: a number to watch. Target: well under 30 s on 2 cores.
#   bench/prepare_brown.sh [path/to/tpc] [tokenizer]     (defaults: build/bin/tpc, gpt2)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tpc="${1:-$root/build/bin/tpc}"
tokenizer="${2:-gpt2}"
input="${TPC_DATA_DIR:-$root/data}/brown/brown.jsonl"
[ -x "$tpc" ] || { echo "prepare_brown: no tpc binary at $tpc (build first, or pass its path)" >&2; exit 1; }
[ -s "$input" ] || { echo "prepare_brown: $input is missing; run scripts/fetch_data.sh" >&2; exit 1; }
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

start=$(date +%s.%N)
summary="$("$tpc" prepare --input "$input" --tokenizer "$tokenizer" --append-eod --workers 2 --output-prefix "$out/brown")"
end=$(date +%s.%N)
echo "$summary"
tokens=$(echo "$summary" | sed -n 's/.* \([0-9][0-9]*\) tokens from.*/\1/p')
awk -v s="$start" -v e="$end" -v t="$tokens" -v tok="$tokenizer" 'BEGIN {
  wall = e - s
  printf "prepare_brown: %s, 2 workers: %.2f s wall (with tokenizer loading), %d tokens, %.0f tokens/s\n", tok, wall, t, t / wall
}'
