#!/usr/bin/env bash
# Builds the libFuzzer targets (build-fuzz/, clang, ASan + UBSan) if needed and runs each for SECONDS
# (default 30), one after another, from the seed corpus in fuzz/corpus/<target>/ (new inputs go to
# build-fuzz/corpus/<target>/, never into the repository). Prints per target: executions, coverage
# (libFuzzer's final cov:) and the result. Exits non-zero on any crash, leak, timeout, out-of-memory or
# sanitizer report; the reproducer path is printed (build-fuzz/artifacts/<target>/...).
#   usage: fuzz/run_fuzzers.sh [SECONDS]      env: TPC_FUZZ_TARGETS="fuzz_tokenizer ..." (default: all),
#          TPC_DATA_DIR (GPT-2 vocabulary for fuzz_tokenizer; default data/), TPC_JOBS (build jobs)
# Reproduce one finding: build-fuzz/fuzz/<target> <reproducer>
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-30}
build=build-fuzz
export TPC_DATA_DIR=${TPC_DATA_DIR:-$PWD/data}

if [ ! -f $build/build.ninja ]; then
  echo "fuzz: configuring $build (clang, ASan + UBSan + libFuzzer)"
  CC=clang-14 CXX=clang++-14 cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTPC_FUZZ=ON \
    -DTPC_CUDA=OFF -DBUILD_TESTING=OFF >/dev/null
fi
echo "fuzz: building the targets ($build)"
if ! ninja -C $build -j"${TPC_JOBS:-$(nproc)}" tpc_fuzzers >$build/build.log 2>&1; then
  grep -v '^\[' $build/build.log | tail -60
  echo "fuzz: error: the build failed (the whole log: $build/build.log)" >&2
  exit 1
fi

# Per target: the longest input worth trying (the seeds' sizes and some room), and a dictionary.
declare -A max_len=([fuzz_model_fb]=32768 [fuzz_model_json]=32768 [fuzz_ir_parser]=16384
                    [fuzz_tokenizer]=4096 [fuzz_indexed_dataset]=4096 [fuzz_checkpoint]=8192)
declare -A dict=([fuzz_model_json]=fuzz/model_json.dict [fuzz_ir_parser]=fuzz/ir.dict
                 [fuzz_indexed_dataset]=fuzz/indexed_dataset.dict [fuzz_checkpoint]=fuzz/checkpoint.dict)
targets=${TPC_FUZZ_TARGETS:-fuzz_model_fb fuzz_model_json fuzz_ir_parser fuzz_tokenizer fuzz_indexed_dataset fuzz_checkpoint}

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
failed=0
summary=()
for t in $targets; do
  work=$build/corpus/$t arts=$build/artifacts/$t log=$build/logs/$t.log
  mkdir -p "$work" "$arts/" "$(dirname "$log")"
  args=(-max_total_time="$seconds" -max_len="${max_len[$t]:-4096}" -timeout=10 -rss_limit_mb=2048
        -print_final_stats=1 -artifact_prefix="$arts/")
  [ -n "${dict[$t]:-}" ] && args+=(-dict="${dict[$t]}")
  echo "fuzz: $t for ${seconds}s"
  rc=0 start=$SECONDS
  $build/fuzz/$t "${args[@]}" "$work" "fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  corp=$(ls "$work" | wc -l)
  if [ "$rc" -eq 0 ] && ! grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|oracle failed' "$log"; then
    result=ok
  else
    failed=1
    what=$(grep -m1 -oE 'ERROR: [A-Za-z]+: [a-z-]+|runtime error: .*|oracle failed: .*|ERROR: libFuzzer: [a-z-]+' "$log" || echo "exit $rc")
    repro=$(sed -n 's/.*Test unit written to \(.*\)/\1/p' "$log" | tail -1)
    result="FAILED ($what) reproducer: ${repro:-none written} log: $log"
    tail -40 "$log"
  fi
  line="$t: $((SECONDS - start))s, ${execs:-?} executions, cov ${cov:-?}, ft ${ft:-?}, corpus $corp: $result"
  echo "fuzz: $line"
  summary+=("$line")
done
echo "fuzz: summary"
printf '  %s\n' "${summary[@]}"
exit $failed
