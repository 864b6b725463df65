#!/usr/bin/env bash
# Our sm_90 GEMM kernel (runtime/cuda/kernels/gemm_sm90.cpp) against cuBLASLt on one GPU, in one call:
#   0. tpc_gemm_bench (where built): the MLP's fused GEMMs alone, ours and cuBLASLt's, b in both layouts;
#   1. its GPU test cases (gelu_bias and dgelu against cuBLASLt, the unfused ops, the CPU and double);
#   2. training steps of each model alternating the TPC_OWN_GEMM settings in SETTINGS (default "0 gelu_bias 1"; `1`
#      includes bias, c_attn's GEMM, since the twenty-fourth session and bias_residual, the attention projection's and
#      c_proj's, since the twenty-fifth: gelu_bias,dgelu,dgelu_bgrad is the earliest `1`; also e.g. dgelu, dgelu,pre1,
#      dgelu_bgrad, all,multicast; a setting with '=' is instead environment assignments joined by '+', e.g.
#      TPC_LN_GRAD_STAGES=3 or TPC_OWN_GEMM=gelu_bias+TPC_MEMBW_OFF=lnregs), ROUNDS times, with the GPU's power draw and SM clock
#      sampled every 100 ms (nvidia-smi): under the 700 W cap a kernel that is faster alone can lose in the step, and
#      the power column shows whether it drew more;
#   3. one profiled step of each model a setting (--profile-step 3 --profile-csv):
#      the gelu_bias and dgelu GEMMs' summed time and TFLOP/s inside the step, by whichever kernel ran them;
#   4. the local-memory instructions (STL, LDL) in the SASS of the GEMM kernels those runs compiled, from the
#      kernel cache (cuobjdump, where the toolkit has it): the deferred epilogue spilled until the nineteenth
#      session (docs/performance.md), and the unit test checks ptxas's report on this CUDA only.
# Prints one table (ms a step over steps 3-N, median W and MHz while it ran). OUTDIR gets five files (a device call
# returns few): summary.txt, gemm_bench_d*.txt, epilogue_tests.log, and every run's log in steps.log and profiles.log.
#   bench/own_gemm_ab.sh OUTDIR [MODEL:ITERS ...]     (default: models/gpt2.fb:40 models/gpt2-medium.fb:20)
# Binaries from TPC_BUILD (default build): bin/tpc, tests/tpc_gpu_tests, models/*.fb. ROUNDS (default 2). GEMM_BENCH=0 and
# EPILOGUE_TESTS=0 leave out parts 0 and 1.
set -uo pipefail

out="${1:?usage: bench/own_gemm_ab.sh OUTDIR [MODEL:ITERS ...]}"
shift
mkdir -p "$out"
build="${TPC_BUILD:-build}"
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=("$build/models/gpt2.fb:40" "$build/models/gpt2-medium.fb:20")
# The kernel cache outside OUTDIR: a device call returns a limited count of files, and the cubins are many.
export TPC_CACHE_DIR="${TPC_CACHE_DIR:-/tmp/own_gemm_ab_kcache}"
scratch="$(mktemp -d "${TMPDIR:-/tmp}/own_gemm_ab.XXXXXX")"   # the power samples and profile CSVs
settings=(${SETTINGS:-0 gelu_bias 1})
rows=()
# A row of the table, also printed as it comes (stderr), so a run cut off by a time limit still shows its rows.
row() { rows+=("$1"); echo "$1" >&2; }
# The environment of a setting: TPC_OWN_GEMM=<setting>, or the setting's own assignments (see part 2).
setting_env() {
  if [[ "$1" == *=* ]]; then printf '%s\n' ${1//+/ }; else printf 'TPC_OWN_GEMM=%s\n' "$1"; fi
}

# 0. The MLP's fused GEMMs alone (bench/gemm_epilogues.cpp): ours and cuBLASLt's, b as [K, N] and as [N, K], at
#    gpt2-medium's shape (GEMM_BENCH_HIDDEN="1024 768" adds gpt2's): whether a slow kernel is slow for its epilogue
#    or for b's layout. 12 settings a shape (GEMM_BENCH_FLAGS="--multicast --pre1" adds 10; GEMM_BENCH_KINDS, default
#    gelu_bias,dgelu,dgelu_bgrad, may add bias, bias_residual and plain: tpc_gemm_bench --help), each a few seconds (the
#    steps' outputs come back to the host in f32).
if [ -x "$build/bin/tpc_gemm_bench" ] && [ "${GEMM_BENCH:-1}" != 0 ]; then
  for hidden in ${GEMM_BENCH_HIDDEN:-1024}; do
    "$build/bin/tpc_gemm_bench" --rows 16384 --hidden "$hidden" --copies 2 --kinds "${GEMM_BENCH_KINDS:-gelu_bias,dgelu,dgelu_bgrad}" \
      ${GEMM_BENCH_FLAGS:-} > "$out/gemm_bench_d$hidden.txt" 2>&1
    rows+=("$(printf '%-34s %s' "tpc_gemm_bench --hidden $hidden" "exit $? ($out/gemm_bench_d$hidden.txt, printed last)")")
  done
fi

# 1. The GPU test cases of the epilogues (ours and cuBLASLt's); EPILOGUE_TESTS=0 leaves them to scripts/gpu_check.sh.
if [ "${EPILOGUE_TESTS:-1}" != 0 ]; then
  "$build/tests/tpc_gpu_tests" "cuda epilogues*" -s > "$out/epilogue_tests.log" 2>&1
  rows+=("$(printf '%-34s %s' "GPU tests: cuda epilogues*" "$(tail -3 "$out/epilogue_tests.log" | grep -E 'passed|failed' | tr -s ' ' | head -1)")")
fi

# 2. Steps, alternating the switch; the power sampler runs beside each. Round r starts at setting r - 1 (mod their
#    count): the first run after a pause or a model change meets a cooler GPU (higher clocks; twenty-fifth session),
#    which should not always be the same setting's.
for round in $(seq 1 "${ROUNDS:-2}"); do
  order=()
  for ((i = 0; i < ${#settings[@]}; ++i)); do order+=("${settings[(i + round - 1) % ${#settings[@]}]}"); done
  for spec in "${runs[@]}"; do
    model="${spec%%:*}" iters="${spec##*:}" name="$(basename "${spec%%:*}" .fb)"
    for kinds in "${order[@]}"; do
      tag="${name}_${kinds//,/-}_r${round}"
      nvidia-smi --query-gpu=power.draw,clocks.sm --format=csv,noheader,nounits -lms 100 > "$scratch/$tag.power.csv" 2>/dev/null &
      smi=$!
      env $(setting_env "$kinds") "$build/bin/tpc" run "$model" --backend cuda --precision bf16 --micro-batch-size 16 \
        --global-batch-size 16 --eval-interval 0 --train-iters "$iters" --log-interval "$iters" > "$scratch/$tag.log" 2>&1
      kill "$smi" 2>/dev/null
      wait "$smi" 2>/dev/null
      { echo "==== $tag: $(setting_env "$kinds" | tr '\n' ' ')$model"; cat "$scratch/$tag.log"; } >> "$out/steps.log"
      ms="$(grep -oE 'time per step \(steps [0-9]+-[0-9]+\): [0-9.]+' "$scratch/$tag.log" | grep -oE '[0-9.]+$')"
      loss="$(grep -oE 'loss [0-9.]+ -> [0-9.]+' "$scratch/$tag.log" | tail -1)"
      power="$(python3 - "$scratch/$tag.power.csv" <<'PY' 2>/dev/null
import statistics, sys
w, c = [], []
for line in open(sys.argv[1]):
    p = [x.strip() for x in line.split(",")]
    try:
        if float(p[0]) > 150: w.append(float(p[0])); c.append(float(p[1]))  # busy samples only
    except (ValueError, IndexError):
        pass
print("%.0f W %.0f MHz (%d samples)" % (statistics.median(w), statistics.median(c), len(w)) if w else "n/a")
PY
)"
      row "$(printf '%-34s %10s ms  %-28s %s' "$tag" "${ms:-FAIL}" "${power:-n/a}" "$loss")"
    done
  done
done

# 3. One profiled step a setting: the GELU GEMMs' time inside the step, from the per-launch CSV.
for spec in "${runs[@]}"; do
  model="${spec%%:*}" name="$(basename "${spec%%:*}" .fb)"
  for kinds in "${settings[@]}"; do
    tag="${name}_${kinds//,/-}_profile"
    env $(setting_env "$kinds") "$build/bin/tpc" run "$model" --backend cuda --precision bf16 --micro-batch-size 16 \
      --global-batch-size 16 --eval-interval 0 --train-iters 4 --log-interval 4 --profile-step 3 --profile-csv "$scratch/$tag.csv" > "$scratch/$tag.log" 2>&1
    { echo "==== $tag: $(setting_env "$kinds" | tr '\n' ' ')$model"; cat "$scratch/$tag.log"; } >> "$out/profiles.log"
    summary="$(python3 - "$scratch/$tag.csv" <<'PY' 2>/dev/null
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
total = sum(float(r["ms"]) for r in rows)
parts = []
def epilogue(r):  # the word after "with epilogue " in the GEMM's description: gelu_bias, bias, bias+residual, dgelu...
    return r["gemm"].split("with epilogue ")[1].split()[0] if "with epilogue " in r["gemm"] else ""
for kind in ("gelu_bias", "bias", "bias+residual", "dgelu", "bgrad_a"):  # bias: without a residual; dgelu: dgelu_bgrad's too
    mine = [r for r in rows if epilogue(r) == kind or (kind == "dgelu" and epilogue(r).startswith("dgelu"))]
    ms = sum(float(r["ms"]) for r in mine)
    fl = [float(r["tflops"]) for r in mine if r["tflops"]]
    parts.append("%s %d x, %.3f ms (%.0f-%.0f TFLOP/s)" % (kind, len(mine), ms, min(fl or [0]), max(fl or [0])))
sums = [r for r in rows if r["op"].startswith("reduce_sum") or "tpc_dgelu_bgrad_columns" in r["what"]
        or "tpc_bgrad_a_columns" in r["what"]]
parts.append("bias sums %d x, %.3f ms" % (len(sums), sum(float(r["ms"]) for r in sums)))
lng = [r for r in rows if r["op"].startswith("layer_norm_grad")]
parts.append("layer_norm_grad %d x, %.3f ms" % (len(lng), sum(float(r["ms"]) for r in lng)))
ln = [r for r in rows if r["op"] == "layer_norm"]
parts.append("layer_norm %d x, %.3f ms" % (len(ln), sum(float(r["ms"]) for r in ln)))
print("; ".join(parts) + "; all launches %.2f ms" % total)
PY
)"
    row "$(printf '%-34s %s' "$tag" "${summary:-FAIL (see $out/profiles.log)}")"
  done
done

# 4. Local memory in the kernels the runs compiled (their cubins in the kernel cache).
if command -v cuobjdump > /dev/null || [ -x /usr/local/cuda/bin/cuobjdump ]; then
  dump="$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)"
  kernels=0 stl=0 ldl=0
  for cubin in "$TPC_CACHE_DIR"/*_sm90a.cubin; do
    [ -e "$cubin" ] || continue
    "$dump" -sass "$cubin" > "$cubin.sass" 2>/dev/null || continue
    grep -qE "gemm_(d?gelu|dgelu_bgrad)_kernel" "$cubin.sass" || continue
    kernels=$((kernels + 1)) stl=$((stl + $(grep -c STL "$cubin.sass"))) ldl=$((ldl + $(grep -c LDL "$cubin.sass")))
  done
  rows+=("$(printf '%-34s %s' "GEMM kernels' SASS" "$kernels cubins: STL $stl, LDL $ldl in all ($TPC_CACHE_DIR/*.sass)")")
fi

printf '%s\n' "${rows[@]}" | tee "$out/summary.txt"
cat "$out"/gemm_bench_d*.txt 2>/dev/null
rm -rf "$scratch"
