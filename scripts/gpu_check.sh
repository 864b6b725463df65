#!/usr/bin/env bash
# One call on a GPU machine: every GPU test, the equivalence runs (CPU vs GPU, tp on virtual ranks) and
# short training runs of tiny.fb and gpt2.fb on the default corpus (data/brown). Logs go to OUTDIR; a short
# table is printed last.
#   scripts/gpu_check.sh OUTDIR
# Where the binaries are: TPC_BUILD (default build): $TPC_BUILD/bin/tpc, $TPC_BUILD/tests/tpc_gpu_tests and
# $TPC_BUILD/models/{tiny,gpt2}.fb (a flat folder holding tpc, tpc_gpu_tests, tiny.fb, gpt2.fb works too).
# Data: TPC_DATA_DIR (default: tpc's own lookup). GPT2_ITERS (default 30) steps of gpt2. The GPU tests run in one
# process (GPU_TESTS picks cases by a Catch2 spec, SUITE_TIMEOUT bounds them, ONLY_TESTS=1 stops after them):
#   ONLY_TESTS=1 GPU_TESTS="cuda epilogues*,cuda param draw*" scripts/gpu_check.sh OUTDIR
# The whole GPU suite takes longer than one 600 s device call (twenty-fifth session): GPU_TESTS_SHARD=i/n runs
# every n-th of the cases listed, from the i-th, so n calls run each case once:
#   ONLY_TESTS=1 GPU_TESTS_SHARD=1/2 scripts/gpu_check.sh OUT1; ONLY_TESTS=1 GPU_TESTS_SHARD=2/2 scripts/gpu_check.sh OUT2
# Exit status: 1 when a row is FAIL or NOT RUN, else 0.
set -uo pipefail

out="${1:?usage: scripts/gpu_check.sh OUTDIR}"
mkdir -p "$out"
build="${TPC_BUILD:-build}"
pick() { for p in "$@"; do [ -e "$p" ] && { echo "$p"; return; }; done; echo "$1"; }
tpc="$(pick "$build/bin/tpc" "$build/tpc")"
tests="$(pick "$build/tests/tpc_gpu_tests" "$build/tpc_gpu_tests")"
tiny="$(pick "$build/models/tiny.fb" "$build/tiny.fb")"
gpt2="$(pick "$build/models/gpt2.fb" "$build/gpt2.fb")"
# NCCL may come from a pip wheel (nvidia-nccl-cu13) rather than the toolkit: put its lib folder on the path.
nccl_dir="$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0] + '/lib')" 2>/dev/null || true)"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${nccl_dir:+:$nccl_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rows=()
failed=0
row() { rows+=("$(printf '%-44s %-6s %s' "$1" "$2" "$3")"); case "$2" in FAIL|"NOT RUN") failed=1;; esac; }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1 || true

# 1. GPU tests: every test case of the GPU test binary (the op test compares every op with the CPU backend; the
#    kernel test every kernel-family case; the training tests whole steps), in one process: a process a case ran
#    only 3 of 35 cases in 540 s on a fresh H100 (docs/performance.md, twenty-fourth session). Catch2's XML report
#    gives a row a case: PASS, FAIL (a failed check, or the case the timeout's SIGTERM stopped) or NOT RUN (after
#    it). GPU_TESTS: a Catch2 test spec picking cases (default all; ',' is "or"); SUITE_TIMEOUT seconds (default
#    1500); ONLY_TESTS=1 stops after them.
spec=(); [ -n "${GPU_TESTS:-}" ] && spec=("$GPU_TESTS")
"$tests" --list-test-names-only "${spec[@]}" 2>/dev/null | sed '/^\s*$/d' > "$out/gpu_tests.list"
if [ -n "${GPU_TESTS_SHARD:-}" ]; then
  # i/n: the listed cases k with k % n == i - 1 (k from 0, in the binary's order), run by name (Catch2's -f).
  if ! [[ "$GPU_TESTS_SHARD" =~ ^([0-9]+)/([0-9]+)$ ]] || [ "${BASH_REMATCH[1]}" -lt 1 ] ||
     [ "${BASH_REMATCH[1]}" -gt "${BASH_REMATCH[2]}" ]; then
    echo "gpu_check.sh: error: GPU_TESTS_SHARD='$GPU_TESTS_SHARD' is not i/n with 1 <= i <= n (e.g. 1/2)" >&2
    exit 1
  fi
  awk -v i="${BASH_REMATCH[1]}" -v n="${BASH_REMATCH[2]}" '(NR - i) % n == 0' "$out/gpu_tests.list" > "$out/gpu_tests.shard"
  mv "$out/gpu_tests.shard" "$out/gpu_tests.list"
  # Catch2 reads each line as a test spec: a name's commas, brackets, '*', '~', quotes and backslashes escaped.
  sed 's/[][\\,*~"]/\\&/g' "$out/gpu_tests.list" > "$out/gpu_tests.names"
  spec=(-f "$out/gpu_tests.names")
fi
timeout "${SUITE_TIMEOUT:-1500}" "$tests" "${spec[@]}" -r xml -d yes -o "$out/gpu_tests.xml" > "$out/gpu_tests.log" 2>&1
rc=$?
row "GPU tests, one process: $(wc -l < "$out/gpu_tests.list") cases" "$([ $rc = 0 ] && echo PASS || echo FAIL)" \
  "exit $rc$([ $rc = 124 ] && echo " (SUITE_TIMEOUT ${SUITE_TIMEOUT:-1500} s)") $(grep -m1 SKIPPED "$out/gpu_tests.log" | cut -c1-90)"
while IFS=$'\t' read -r verdict name detail; do
  row "test: ${name:0:42}" "$verdict" "$detail"
done < <(python3 - "$out/gpu_tests.list" "$out/gpu_tests.xml" <<'PY' 2>"$out/gpu_tests.parse.err" || printf 'FAIL\t(the XML report could not be read)\t%s\n' "$out/gpu_tests.xml"
import html, os, re, sys
names = [l.rstrip("\n") for l in open(sys.argv[1]) if l.strip()]
text = open(sys.argv[2], errors="replace").read() if os.path.exists(sys.argv[2]) else ""
cases = {}
# Each case's element up to the next one (a report cut short still gives the cases before the cut).
for m in re.finditer(r'<TestCase name="([^"]*)"(.*?)(?=<TestCase name="|\Z)', text, re.S):
    body = m.group(2)
    result = re.search(r'<OverallResult success="(true|false)"(?: durationInSeconds="([0-9.]+)")?', body)
    warnings = [" ".join(html.unescape(w).split()) for w in re.findall(r"<Warning>(.*?)</Warning>", body, re.S)]
    fatal = re.search(r"<FatalErrorCondition[^>]*>(.*?)</FatalErrorCondition>", body, re.S)
    failed = re.search(r'<Expression success="false"[^>]*filename="([^"]*)" line="(\d+)"', body)
    if not result or result.group(1) == "false" or fatal:
        why = (" ".join(html.unescape(fatal.group(1)).split()) if fatal else
               "failed at %s:%s" % (os.path.basename(failed.group(1)), failed.group(2)) if failed else "no result")
        cases[html.unescape(m.group(1))] = ("FAIL", why)
    else:
        keep = [w for w in warnings if re.search("rel err|outputs compared|worst relative|NCCL", w)][-2:]
        cases[html.unescape(m.group(1))] = ("PASS", ("%ss " % result.group(2) if result.group(2) else "") + " ".join(keep))
for n in names:
    verdict, detail = cases.get(n, ("NOT RUN", "the suite ended before it (see gpu_tests.log)"))
    print("%s\t%s\t%s" % (verdict, n, detail[:150]))
if not names:
    print("FAIL\t(no test cases listed)\t%s" % sys.argv[1])
PY
)
if [ "${ONLY_TESTS:-0}" = 1 ]; then
  echo
  echo "== tpc GPU tests ($(head -1 "$out/gpu.txt" 2>/dev/null)); logs in $out"
  printf '%s\n' "${rows[@]}"
  exit "$failed"
fi

# 2. Equivalence: tiny.fb, same seed and data, CPU vs GPU (fp32), and tp 2 on virtual ranks vs tp 1 (GPU).
common=(--train-iters 10 --log-interval 1 --seed 1 --precision fp32)
"$tpc" run "$tiny" "${common[@]}" --backend cpu --log-jsonl "$out/tiny_cpu.jsonl" > "$out/tiny_cpu.log" 2>&1
"$tpc" run "$tiny" "${common[@]}" --backend cuda --log-jsonl "$out/tiny_gpu.jsonl" > "$out/tiny_gpu.log" 2>&1
# A failing GPU run is repeated eagerly (TPC_CUDA_DEBUG=1: no graph, a sync after every launch) to name the kernel.
[ -s "$out/tiny_gpu.jsonl" ] || TPC_CUDA_DEBUG=1 "$tpc" run "$tiny" --train-iters 1 --backend cuda > "$out/tiny_gpu_debug.log" 2>&1
"$tpc" run "$tiny" "${common[@]}" --backend cuda --tp 2 --log-jsonl "$out/tiny_gpu_tp2.jsonl" > "$out/tiny_gpu_tp2.log" 2>&1
cmp_losses() {  # worst relative loss difference between two JSONL logs
  python3 - "$1" "$2" <<'PY' 2>/dev/null || echo "n/a"
import json, sys
a = [r["loss"] for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
b = [r["loss"] for r in map(json.loads, open(sys.argv[2])) if "loss" in r]
if not a or len(a) != len(b): print("n/a (%d vs %d steps)" % (len(a), len(b))); sys.exit()
print("%.2e over %d steps (%.4f -> %.4f)" % (max(abs(x - y) / abs(y) for x, y in zip(a, b)), len(a), a[0], a[-1]))
PY
}
e1="$(cmp_losses "$out/tiny_gpu.jsonl" "$out/tiny_cpu.jsonl")"
row "tiny.fb 10 steps GPU vs CPU (fp32)" "$(python3 -c "import sys; print('PASS' if float(sys.argv[1]) <= 1e-4 else 'FAIL')" "${e1%% *}" 2>/dev/null || echo FAIL)" "loss rel diff $e1"
e2="$(cmp_losses "$out/tiny_gpu_tp2.jsonl" "$out/tiny_gpu.jsonl")"
row "tiny.fb tp 2 virtual ranks vs tp 1 (GPU)" "$(python3 -c "import sys; print('PASS' if float(sys.argv[1]) <= 1e-4 else 'FAIL')" "${e2%% *}" 2>/dev/null || echo FAIL)" "loss rel diff $e2"

# bf16 compute (mixed-precision pass; f32 masters) on the GPU vs the fp32 CPU run: the issue's 2e-2.
"$tpc" run "$tiny" --train-iters 10 --log-interval 1 --seed 1 --backend cuda --precision bf16 --log-jsonl "$out/tiny_gpu_bf16.jsonl" > "$out/tiny_gpu_bf16.log" 2>&1
e3="$(cmp_losses "$out/tiny_gpu_bf16.jsonl" "$out/tiny_cpu.jsonl")"
row "tiny.fb 10 steps GPU bf16 vs CPU fp32" "$(python3 -c "import sys; print('PASS' if float(sys.argv[1]) <= 2e-2 else 'FAIL')" "${e3%% *}" 2>/dev/null || echo FAIL)" "loss rel diff $e3"

# Determinism: the same run twice on the GPU (bf16, tp 2 on virtual ranks) must give bit-identical losses.
for k in 1 2; do
  "$tpc" run "$tiny" --train-iters 10 --log-interval 1 --seed 1 --backend cuda --precision bf16 --tp 2 \
    --log-jsonl "$out/tiny_det$k.jsonl" > "$out/tiny_det$k.log" 2>&1
done
same="$(python3 - "$out/tiny_det1.jsonl" "$out/tiny_det2.jsonl" <<'PY' 2>/dev/null || echo "n/a"
import json, sys
a = [(r["loss"], r["grad_norm"]) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
b = [(r["loss"], r["grad_norm"]) for r in map(json.loads, open(sys.argv[2])) if "loss" in r]
print("identical" if a and a == b else "DIFFERENT", "over", len(a), "steps")
PY
)"
row "same GPU run twice: bit-identical losses" "$([ "${same%% *}" = identical ] && echo PASS || echo FAIL)" "$same"

# One process per rank through the GPU machine's own OpenMPI (the CPU backend; libmpi.so.40 dlopened): tp 2
# under mpirun -np 2 must give the one-process run's losses bit for bit.
if command -v mpirun >/dev/null; then
  mp=(mpirun -np 2 --oversubscribe); [ "$(id -u)" = 0 ] && mp+=(--allow-run-as-root)
  "$tpc" run "$tiny" --train-iters 4 --log-interval 1 --seed 1 --backend cpu --tp 2 --log-jsonl "$out/mpi_one.jsonl" > "$out/mpi_one.log" 2>&1
  timeout 120 "${mp[@]}" "$tpc" run "$tiny" --train-iters 4 --log-interval 1 --seed 1 --backend cpu --tp 2 \
    --log-jsonl "$out/mpi_two.jsonl" > "$out/mpi_two.log" 2>&1
  e4="$(cmp_losses "$out/mpi_two.jsonl" "$out/mpi_one.jsonl")"
  row "mpirun -np 2, tp 2 (CPU) vs one process" "$(python3 -c "import sys; print('PASS' if float(sys.argv[1]) == 0 else 'FAIL')" "${e4%% *}" 2>/dev/null || echo FAIL)" "loss rel diff $e4"
  # The CUDA backend under mpirun: -np 1 is the one-process GPU run, bit for bit; -np 2 with tp 2 runs a rank
  # per process on GPUs 0 and 1 through NCCL (ids through MPI), or, on a machine of one GPU, fails with one
  # error line from the process that has no GPU of its own, and the job ends.
  mp1=(mpirun -np 1); [ "$(id -u)" = 0 ] && mp1+=(--allow-run-as-root)
  timeout 120 "${mp1[@]}" "$tpc" run "$tiny" "${common[@]}" --backend cuda --log-jsonl "$out/mpi_cuda1.jsonl" > "$out/mpi_cuda1.log" 2>&1
  e5="$(cmp_losses "$out/mpi_cuda1.jsonl" "$out/tiny_gpu.jsonl")"
  row "mpirun -np 1, GPU vs one process" "$(python3 -c "import sys; print('PASS' if float(sys.argv[1]) == 0 else 'FAIL')" "${e5%% *}" 2>/dev/null || echo FAIL)" "loss rel diff $e5"
  gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
  timeout 300 "${mp[@]}" "$tpc" run "$tiny" "${common[@]}" --backend cuda --tp 2 --log-jsonl "$out/mpi_cuda2.jsonl" > "$out/mpi_cuda2.log" 2>&1
  rc=$?
  if [ "$gpus" -ge 2 ]; then
    e6="$(cmp_losses "$out/mpi_cuda2.jsonl" "$out/tiny_gpu_tp2.jsonl")"
    row "mpirun -np 2, tp 2 (GPU, NCCL) vs one process" "$(python3 -c "import sys; print('PASS' if float(sys.argv[1]) <= 1e-4 else 'FAIL')" "${e6%% *}" 2>/dev/null || echo FAIL)" "loss rel diff $e6"
  else
    n="$(grep -c 'tpc run: error' "$out/mpi_cuda2.log")"
    row "mpirun -np 2, tp 2 (GPU) on $gpus GPU: error" "$([ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$n" = 1 ] && echo PASS || echo FAIL)" \
      "exit $rc: $(grep -m1 'tpc run: error' "$out/mpi_cuda2.log" | cut -c1-120)"
  fi
fi

# 3. gpt2 (124M) on the default corpus.
for prec in fp32 bf16; do
  "$tpc" run "$gpt2" --backend cuda --precision $prec --train-iters "${GPT2_ITERS:-30}" --log-interval 5 --micro-batch-size 8 \
    --global-batch-size 8 --eval-interval 0 --log-jsonl "$out/gpt2_$prec.jsonl" > "$out/gpt2_$prec.log" 2>&1
  rc=$?
  g="$(grep -E '^done:' "$out/gpt2_$prec.log" | tail -1)"
  mem="$(grep -oE 'GPU mem [0-9.]+ GiB' "$out/gpt2_$prec.log" | tail -1)"
  mfu="$(grep -oE 'MFU [0-9.]+% of [^|]*' "$out/gpt2_$prec.log" | tail -1)"
  launches="$(grep -oE '[0-9]+ launches per step' "$out/gpt2_$prec.log" | head -1)"
  plan="$(grep -oE 'activations arena [0-9.]+ MiB' "$out/gpt2_$prec.log" | head -1)"
  row "gpt2.fb $prec ${GPT2_ITERS:-30} steps, micro batch 8 x 1024" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "${g#done: } | $mfu| $mem | $plan | $launches"
done

# 3b. Where a gpt2 bf16 step goes at micro batch 16 (tpc run --profile-step: GPU time per op), and with
#     BENCH=1 tpc against PyTorch eager and torch.compile on the same GPT-2 (bench/vs_pytorch.py).
"$tpc" run "$gpt2" --backend cuda --precision bf16 --train-iters 4 --log-interval 1 --micro-batch-size 16 \
  --global-batch-size 16 --eval-interval 0 --profile-step 3 --profile-csv "$out/gpt2_profile.csv" > "$out/gpt2_profile.log" 2>&1
rc=$?
top="$(grep -A4 -E '^  op +launches' "$out/gpt2_profile.log" | tail -3 | awk '{printf "%s %s ms, ", $1, $3}')"
# The CSV (--profile-csv) holds every launch the table counted.
counted="$(grep -oE 'profile of step 3: [0-9]+ launches' "$out/gpt2_profile.log" | grep -oE '[0-9]+ launches' | grep -oE '[0-9]+')"
csvrows=$(( $( (cat "$out/gpt2_profile.csv" 2>/dev/null || true) | wc -l) - 1 ))
[ "$rc" = 0 ] && [ -n "$counted" ] && [ "$csvrows" = "$counted" ] || rc=1
row "gpt2.fb bf16 profile, micro batch 16 x 1024" "$([ $rc = 0 ] && echo DONE || echo FAIL)" "$(grep -oE '[0-9]+ launches, [0-9.]+ ms' "$out/gpt2_profile.log" | head -1); ${top%, }; CSV rows $csvrows"
if [ "${BENCH:-0}" = 1 ]; then
  bench="$(pick "$build/bench/vs_pytorch.py" "bench/vs_pytorch.py")"
  python3 "$bench" --tpc "$tpc" --configs "${BENCH_CONFIGS:-gpt2}" --steps "${BENCH_STEPS:-200}" \
    --data "${TPC_DATA_DIR:-data}/brown/brown_gpt2" --out "$out/bench" > "$out/bench.log" 2>&1
  rc=$?
  row "bench: tpc vs PyTorch (${BENCH_CONFIGS:-gpt2}, ${BENCH_STEPS:-200} steps)" "$([ $rc = 0 ] && echo DONE || echo FAIL)" "table in $out/bench.log"
fi

# 4. Checkpoints across tp on the GPU (bf16): saved at tp 4 on virtual ranks after 4 steps, loaded at tp 1 and 2;
#    the 5th step's loss must agree with tp 4's own 5th step within bf16 tolerance.
scratch="$(mktemp -d "${TMPDIR:-/tmp}/tpc_gpu_check.XXXXXX")"  # checkpoints stay out of OUTDIR
ck=(--train-iters 5 --log-interval 1 --seed 1 --backend cuda --precision bf16)
"$tpc" run "$tiny" "${ck[@]}" --tp 4 --save "$scratch/ck" --save-interval 4 --log-jsonl "$out/ck_tp4.jsonl" > "$out/ck_tp4.log" 2>&1
for tp in 1 2; do
  "$tpc" run "$tiny" "${ck[@]}" --tp $tp --load "$scratch/ck/iter_0000004" --log-jsonl "$out/ck_load_tp$tp.jsonl" > "$out/ck_load_tp$tp.log" 2>&1
  d="$(python3 - "$out/ck_tp4.jsonl" "$out/ck_load_tp$tp.jsonl" <<'PY' 2>/dev/null || echo "n/a"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
x = [r["loss"] for r in a if r.get("step") == 5 and "loss" in r][0]
y = [r["loss"] for r in b if r.get("step") == 5 and "loss" in r][0]
print("%.2e (tp 4: %.5f, loaded: %.5f)" % (abs(x - y) / abs(x), x, y))
PY
)"
  row "checkpoint tp 4 -> tp $tp, step 5 (GPU bf16)" "$(python3 -c "import sys; print('PASS' if float(sys.argv[1]) <= 2e-2 else 'FAIL')" "${d%% *}" 2>/dev/null || echo FAIL)" "loss rel diff $d"
done

# 5. Hugging Face: gpt2 trained above (bf16, saved), exported, loaded by transformers; its logits vs tpc's
#    forward (CPU, fp32) on the same prompt.
"$tpc" run "$gpt2" --backend cuda --train-iters 3 --micro-batch-size 8 --global-batch-size 8 --eval-interval 0 --quiet --save "$scratch/gpt2" > "$out/hf_train.log" 2>&1
"$tpc" export --hf "$scratch/hf" "$scratch/gpt2" > "$out/hf_export.log" 2>&1
"$tpc" sample --load "$scratch/gpt2" --prompt "The jury said the election was" --max-tokens 8 --temperature 0 \
  --dump-logits "$out/gpt2_prompt_logits.safetensors" > "$out/hf_sample.log" 2>&1
python3 scripts/check_hf_export.py "$scratch/hf" "$out/gpt2_prompt_logits.safetensors" > "$out/hf_check.log" 2>&1
rc=$?
row "HF export of gpt2: transformers vs tpc logits" "$([ $rc = 0 ] && echo PASS || echo FAIL)" "$(tail -1 "$out/hf_check.log" | cut -c1-150)"
row "tpc sample gpt2 (greedy, 8 tokens)" "$([ -s "$out/hf_sample.log" ] && echo DONE || echo FAIL)" "$(tail -1 "$out/hf_sample.log" | cut -c1-100)"
rm -rf "$scratch"

echo
echo "== tpc GPU check ($(cat "$out/gpu.txt" 2>/dev/null | head -1)); logs in $out"
for r in "${rows[@]}"; do echo "$r"; done
[ -s "$out/bench.log" ] && { echo; grep -vE '^(\+|step|cuda:)' "$out/bench.log" | tail -40; }
# Exit 1 when a row failed (or a test did not run), 0 otherwise.
exit "$failed"

