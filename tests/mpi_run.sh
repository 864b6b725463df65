#!/usr/bin/env bash
# `mpirun -np N tpc run ... --backend cpu`: one process per mesh rank, collectives through MPI. The losses must
# equal the one-process run's bit for bit (tp 2; tp 2 x dp 2), a checkpoint saved by the mpirun job must resume
# in one process to the same losses, -np 1 of an unsharded run must equal the one-process run, and a wrong
# process count is one error line, exit 1 (as is --backend cuda where there is no GPU).
#   tests/mpi_run.sh TPC_BINARY TINY_MODEL WORKDIR
# Exits 77 (skipped) where OpenMPI's mpirun is not installed (scripts/setup.sh installs it).
set -u
tpc="$1" model="$2" work="$3"
command -v mpirun >/dev/null || { echo "mpi_run: no mpirun here (apt-get install openmpi-bin): skipped"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
mpirun=(mpirun --oversubscribe)
[ "$(id -u)" = 0 ] && mpirun+=(--allow-run-as-root)
common=(--train-iters 6 --log-interval 1 --seed 1 --backend cpu --threads 1)
failures=0
# expect_error WHAT WANT CMD...: CMD (an mpirun job) must exit non-zero, not by timing out, with exactly one
# 'tpc run: error' line, and that line must contain WANT.
expect_error() {
  local what="$1" want="$2" err rc line
  shift 2
  err="$(timeout 120 "$@" 2>&1)"
  rc=$?
  line="$(grep "tpc run: error" <<< "$err")"
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$(grep -c "tpc run: error" <<< "$err")" = 1 ] && grep -qF -- "$want" <<< "$line"; then
    echo "ok: $what -> ${line:0:200}"
  else
    echo "FAIL: $what: exit $rc: $err"
    failures=$((failures + 1))
  fi
}
losses() { python3 -c "import json,sys; print([json.loads(l)['loss'] for l in open(sys.argv[1]) if '\"loss\"' in l])" "$1"; }
same() {  # what, a.jsonl, b.jsonl
  local a b
  a="$(losses "$2")" b="$(losses "$3")"
  if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" != "[]" ]; then echo "ok: $1: $a"
  else echo "FAIL: $1: $a vs $b"; failures=$((failures + 1)); fi
}

"$tpc" run "$model" "${common[@]}" --tp 2 --log-jsonl "$work/tp2_one.jsonl" > "$work/tp2_one.log" 2>&1
timeout 120 "${mpirun[@]}" -np 2 "$tpc" run "$model" "${common[@]}" --tp 2 --log-jsonl "$work/tp2_mpi.jsonl" \
  > "$work/tp2_mpi.log" 2>&1 || { echo "FAIL: mpirun -np 2: exit $?"; cat "$work/tp2_mpi.log"; failures=$((failures + 1)); }
same "tp 2: one process vs mpirun -np 2" "$work/tp2_one.jsonl" "$work/tp2_mpi.jsonl"

mesh=(--tp 2 --dp 2 --global-batch-size 16)
"$tpc" run "$model" "${common[@]}" "${mesh[@]}" --log-jsonl "$work/m4_one.jsonl" > "$work/m4_one.log" 2>&1
timeout 180 "${mpirun[@]}" -np 4 "$tpc" run "$model" "${common[@]}" "${mesh[@]}" --log-jsonl "$work/m4_mpi.jsonl" \
  --save "$work/ck" --save-interval 3 > "$work/m4_mpi.log" 2>&1 ||
  { echo "FAIL: mpirun -np 4: exit $?"; cat "$work/m4_mpi.log"; failures=$((failures + 1)); }
same "tp 2 x dp 2: one process vs mpirun -np 4" "$work/m4_one.jsonl" "$work/m4_mpi.jsonl"
# Rank 0 alone writes the checkpoint, with every rank's blocks; one process resumes from it.
"$tpc" run "$model" "${common[@]}" "${mesh[@]}" --load "$work/ck/iter_0000003" --log-jsonl "$work/resumed.jsonl" \
  > "$work/resumed.log" 2>&1
python3 - "$work/m4_one.jsonl" "$work/steps4to6.jsonl" <<'PY'
import sys
rows = [l for l in open(sys.argv[1]) if '"step": 4,' in l or '"step": 5,' in l or '"step": 6,' in l]
open(sys.argv[2], "w").writelines(rows)
PY
same "checkpoint of mpirun -np 4 at step 3, resumed in one process: steps 4-6" "$work/steps4to6.jsonl" "$work/resumed.jsonl"
# Only rank 0 prints: one 'done:' line.
n="$(grep -c '^done:' "$work/m4_mpi.log")"
[ "$n" = 1 ] && echo "ok: one 'done:' line from 4 processes" || { echo "FAIL: $n 'done:' lines"; failures=$((failures + 1)); }

# 3 processes for a 2-rank mesh: one error line naming both counts; mpirun exits non-zero.
expect_error "-np 3 for tp 2" \
  "tpc run: error: mpirun started 3 processes, but the run's mesh(tp=2) has 2 ranks: start one process per rank (mpirun -np 2)" \
  "${mpirun[@]}" -np 3 "$tpc" run "$model" "${common[@]}" --tp 2
# A NaN on rank 1 alone (TPC_TEST_FAULT): the mpirun job names the same first non-finite value, on rank 1, as
# the one process does (the processes gather their findings), in one error line, and ends with exit != 0.
fault="step=2,nan=%1,nan-rank=1"
one="$(TPC_TEST_FAULT="$fault" "$tpc" run "$model" "${common[@]}" --tp 2 2>&1 | grep "tpc run: error")"
if grep -q "on rank 1: nan" <<< "$one"; then
  TPC_TEST_FAULT="$fault" expect_error "a NaN on rank 1 under mpirun -np 2 (the one-process error)" "$one" \
    "${mpirun[@]}" -np 2 -x TPC_TEST_FAULT "$tpc" run "$model" "${common[@]}" --tp 2
else
  echo "FAIL: a NaN on rank 1 in one process: '$one' does not name rank 1"
  failures=$((failures + 1))
fi

# mpirun -np 1 of an unsharded run is the one-process run; -np 2 of it is one error line.
"$tpc" run "$model" "${common[@]}" --log-jsonl "$work/plain_one.jsonl" > "$work/plain_one.log" 2>&1
timeout 120 "${mpirun[@]}" -np 1 "$tpc" run "$model" "${common[@]}" --log-jsonl "$work/plain_np1.jsonl" > "$work/plain_np1.log" 2>&1 ||
  { echo "FAIL: mpirun -np 1 of an unsharded run: exit $?"; cat "$work/plain_np1.log"; failures=$((failures + 1)); }
same "unsharded: one process vs mpirun -np 1" "$work/plain_one.jsonl" "$work/plain_np1.jsonl"
expect_error "-np 2 of an unsharded run" \
  "tpc run: error: mpirun started 2 processes for an unsharded run; add --tp, --dp or --sp so that their product is 2" \
  "${mpirun[@]}" -np 2 "$tpc" run "$model" "${common[@]}"

# --exit-signal-handler: SIGTERM to one process of the job (rank 1's, the newest) ends the run on both after the
# same step (the processes gather their reasons), with one checkpoint, exit 0; --exit-interval stops both at 2.
timeout 180 "${mpirun[@]}" -np 2 "$tpc" run "$model" "${common[@]/6/100000}" --tp 2 --eval-interval 0 \
  --exit-signal-handler --save "$work/sig" > "$work/sig.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "step      2/" "$work/sig.log" && break; sleep 0.1; done
kill -TERM "$(pgrep -n -f "tpc run .*--save $work/sig")"
wait $job
rc=$?
if [ $rc = 0 ] && grep -q "^stopped after step [0-9]* of 100000: " "$work/sig.log" && [ -s "$work/sig/latest_checkpointed_iteration.txt" ]; then
  echo "ok: SIGTERM to one process of mpirun -np 2: $(grep '^stopped' "$work/sig.log")"
else
  echo "FAIL: SIGTERM to one process of mpirun -np 2: exit $rc: $(cat "$work/sig.log")"; failures=$((failures + 1))
fi
timeout 120 "${mpirun[@]}" -np 2 "$tpc" run "$model" "${common[@]}" --tp 2 --exit-interval 2 > "$work/exit.log" 2>&1 &&
  grep -q "^stopped after step 2 of 6: --exit-interval 2" "$work/exit.log" && echo "ok: --exit-interval 2 under mpirun -np 2" ||
  { echo "FAIL: --exit-interval under mpirun -np 2: $(cat "$work/exit.log")"; failures=$((failures + 1)); }

# --backend cuda under mpirun where no process has a GPU (this check runs only on such machines): one error line,
# a non-zero exit, no process left waiting for the others.
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  expect_error "--backend cuda without a GPU under mpirun -np 2" "tpc run: error" \
    "${mpirun[@]}" -np 2 "$tpc" run "$model" "${common[@]/cpu/cuda}" --tp 2
fi
exit $((failures > 0))
