#!/usr/bin/env bash
# Builds tpc (installing what it needs, as scripts/setup.sh does) and runs the whole test suite.
# GPU tests (CTest label `gpu`) run only where a GPU is visible; elsewhere they are listed as skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh --no-run
exclude=()
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test: no GPU here: skipping the tests labelled gpu"
  exclude=(-LE gpu)
fi
ctest --test-dir build -j"${TPC_JOBS:-$(nproc)}" --output-on-failure "${exclude[@]}"
