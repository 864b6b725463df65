#!/usr/bin/env bash
# Builds tpc (installing what it needs, as scripts/setup.sh does) and runs, in order:
#   1. the whole test suite (build/)
#   2. the CPU suite again under ASan + UBSan with leak detection (scripts/test_sanitizers.sh, build-asan/)
#   3. every fuzz target for TPC_FUZZ_SECONDS (default 30) seconds (fuzz/run_fuzzers.sh, build-fuzz/)
# CI (.ci/run) runs all three. For a quick local run of the suite alone: TPC_TEST_HARDENING=0 bash scripts/test.sh
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
[ "${TPC_TEST_HARDENING:-1}" = 0 ] && exit 0
echo "test: build $((t1 - t0))s, test suite $((t2 - t1))s"

bash scripts/test_sanitizers.sh
t3=$SECONDS
echo "test: sanitizer build and suite $((t3 - t2))s"
bash fuzz/run_fuzzers.sh "${TPC_FUZZ_SECONDS:-30}"
t4=$SECONDS
echo "test: fuzz build and targets $((t4 - t3))s"
echo "test: all passed in $((t4 - t0))s: build $((t1 - t0))s, suite $((t2 - t1))s, sanitizers $((t3 - t2))s, fuzzers $((t4 - t3))s"
