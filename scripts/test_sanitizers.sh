#!/usr/bin/env bash
# Builds tpc with AddressSanitizer + UndefinedBehaviorSanitizer (-DTPC_SANITIZE=ON, CPU only) into
# build-asan/ and runs the CPU test suite there, leak detection on. Any sanitizer report fails the test
# that triggered it, including reports from the tpc binary that CLI tests start (they exit 86, never the
# 1 that a test may expect).
#
# Cheap on purpose (CI has 2 cores): -O1 -g1 (line tables for the reports), assertions on, a separate
# build dir. Not run here: the tests labelled gpu, and the one labelled train (train.tiny_cpu_loss_drops_40pct:
# 300 steps of the tiny GPT, 25 s in the normal build; a step of it costs about 4 s of CPU under ASan at -O1,
# so about 20 minutes, far over its 180 s limit), and the one labelled mpi (run.mpirun_one_process_per_rank:
# OpenMPI's libraries keep allocations to process exit that leak detection would report as tpc's). The sanitized suite still trains through `tpc run` in the
# [run] tests (a few steps each, on one rank and on tp=2) and on the CPU mesh in the sharding-equivalence tests.
#   env: TPC_JOBS (build and test jobs, default: all cores), TPC_DATA_DIR (as for scripts/test.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
build=build-asan
echo "sanitizers: building tpc with ASan + UBSan ($build/)"
cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Debug "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g1" "-DCMAKE_C_FLAGS_DEBUG=-O1 -g1" \
  -DTPC_CUDA=OFF -DTPC_SANITIZE=ON ${TPC_CMAKE_ARGS:-} >/dev/null
if ! ninja -C $build -j"${TPC_JOBS:-$(nproc)}" >$build/build.log 2>&1; then
  grep -v '^\[' $build/build.log | tail -60
  echo "sanitizers: error: the build failed (the whole log: $build/build.log)" >&2
  exit 1
fi
test -x $build/bin/tpc
# -fno-sanitize-recover=all: the first report ends the process. exitcode=86: a sanitized child process
# (tpc, started by a CLI test that expects exit 1) that hits a report can never pass for a user error.
export ASAN_OPTIONS=detect_leaks=1:exitcode=86:abort_on_error=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=86
ctest --test-dir $build -j"${TPC_JOBS:-$(nproc)}" --output-on-failure -LE 'train|gpu|mpi'
