#!/usr/bin/env bash
# Builds tpc (installing what it needs, as scripts/setup.sh does) and runs the whole test suite, then the
# hardening checks: the CPU suite again under ASan + UBSan (scripts/test_sanitizers.sh) and every fuzz
# target for 30 seconds (fuzz/run_fuzzers.sh). The hardening parts run only with TPC_TEST_HARDENING=1 (the full ASan build is slow on 2 cores).
# GPU tests (CTest label `gpu`) run only where a GPU is visible; elsewhere they are listed as skipped.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
t0=$SECONDS
bash scripts/setup.sh --no-run
t1=$SECONDS
exclude=()
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "test: no GPU here: skipping the tests labelled gpu"
  exclude=(-LE gpu)
fi
ctest --test-dir build -j"${TPC_JOBS:-$(nproc)}" --output-on-failure "${exclude[@]}"
t2=$SECONDS
# Without the hardening parts CTest's summary stays the last line.
[ "${TPC_TEST_HARDENING:-0}" = 1 ] || exit 0
echo "test: build $((t1 - t0))s, test suite $((t2 - t1))s"

bash scripts/test_sanitizers.sh
t3=$SECONDS
echo "test: sanitizer build and suite $((t3 - t2))s"
bash fuzz/run_fuzzers.sh 30
t4=$SECONDS
echo "test: fuzz build and targets $((t4 - t3))s"
echo "test: all passed: build $((t1 - t0))s, suite $((t2 - t1))s, sanitizers $((t3 - t2))s, fuzzers $((t4 - t3))s"
