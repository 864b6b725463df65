#!/usr/bin/env bash
# Builds tpc with AddressSanitizer + UndefinedBehaviorSanitizer (-DTPC_SANITIZE=ON, CPU only) into
# build-asan/ and runs the CPU test suite there, except the tests labelled train (the tiny training run,
# slow under the sanitizers) and gpu. Any sanitizer report fails the test that triggered it.
#   env: TPC_JOBS (build and test jobs, default: all cores), TPC_DATA_DIR (as for scripts/test.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build-asan
echo "sanitizers: building tpc with ASan + UBSan ($build/)"
cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPC_CUDA=OFF -DTPC_SANITIZE=ON ${TPC_CMAKE_ARGS:-} >/dev/null
if ! ninja -C $build -j"${TPC_JOBS:-$(nproc)}" >$build/build.log 2>&1; then
  grep -v '^\[' $build/build.log | tail -60
  echo "sanitizers: error: the build failed (the whole log: $build/build.log)" >&2
  exit 1
fi
test -x $build/bin/tpc
# halt_on_error with -fno-sanitize-recover=all: the first report aborts the process, so the test fails.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir $build -j"${TPC_JOBS:-$(nproc)}" --output-on-failure -LE 'train|gpu'
