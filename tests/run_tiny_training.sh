#!/usr/bin/env bash
# The CPU training check of the model-file issue: `tpc run models/tiny.fb` on the default corpus lowers
# the loss by at least 40% from its first-step value (CTest gives it 180 s, the 3 minutes).
#   run_tiny_training.sh TPC_BINARY MODEL_FB WORK_DIR
set -euo pipefail
tpc="$1" model="$2" work="$3"
mkdir -p "$work"
log="$work/tiny_run.jsonl"
"$tpc" run "$model" --log-jsonl "$log" --log-interval 10 | tee "$work/tiny_run.txt"
# The first and last step's loss (the log also holds valid_loss/test_loss lines of the model file's evaluations).
# grep -m1, not `grep | head -n1`: head leaving early kills grep with SIGPIPE once the matches pass a pipe buffer (4 KiB),
# and pipefail then ended the script silently, a failure about one run in six.
first=$(grep -m1 '"loss": ' "$log" | sed -E 's/.*"loss": ([-0-9.e+]+).*/\1/')
last=$(grep '"loss": ' "$log" | tail -n1 | sed -E 's/.*"loss": ([-0-9.e+]+).*/\1/')
for key in step loss lr grad_norm tokens_per_s elapsed_s; do
  grep -q "\"$key\": " "$log" || { echo "FAIL: the JSONL log has no key $key"; exit 1; }
done
awk -v f="$first" -v l="$last" 'BEGIN {
  drop = 1 - l / f
  printf "first loss %.4f, last loss %.4f: %.1f%% lower (need >= 40%%)\n", f, l, 100 * drop
  exit !(drop >= 0.40)
}'
