#!/usr/bin/env bash
# tpc_gemm_bench (bench/gemm_epilogues.cpp) refuses bad arguments with one error line naming the flag and exit 1
# before it touches a GPU, and prints its usage for --help.
#   tests/gemm_bench_args.sh TPC_GEMM_BENCH
set -u
bench="$1"
cmd=("$bench")
source "$(dirname "$0")/expect_error.sh"
expect_error "--rows must be a multiple of 256" --rows 100
expect_error "--hidden must be a multiple of 64" --hidden 100
expect_error "--copies must be a positive integer, got '0'" --copies 0
expect_error "--rows must be a positive integer, got '12x'" --rows 12x
expect_error "--kinds: 'gelu' is not gelu_bias, dgelu, dgelu_bgrad, bias, bias_residual or plain" --kinds bias_residual,gelu
expect_error "--kinds: 'dgelu@fc2': only bias, bias_residual and plain take a shape, @fc1, @proj or @fc2" --kinds dgelu@fc2
expect_error "--kinds: 'bias@fc3': only bias, bias_residual and plain take a shape" --kinds bias@proj,bias@fc3
expect_error "--kinds: 'gelu@fc2' is not gelu_bias" --kinds gelu@fc2
expect_error "--rows <= 1048576" --rows 2097152
expect_error "unknown option '--fast'" --fast 1
expect_error "--copies needs a value" --copies
help="$("$bench" --help)"
if [ $? -ne 0 ] || [[ "$help" != usage:\ tpc_gemm_bench* ]]; then
  echo "FAIL: --help: $help"
  failures=$((failures + 1))
fi
[ "$failures" -eq 0 ] || { echo "$failures failures"; exit 1; }
