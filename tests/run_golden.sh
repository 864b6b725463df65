#!/usr/bin/env bash
# Golden IR test driver: runs `tpc opt FILE <the RUN line's args>` and checks stdout and stderr (together,
# stderr first: --print-after dumps) with FileCheck against FILE's CHECK lines. tpc must exit 0.
# usage: run_golden.sh TPC FILECHECK FILE [%name=value ...]   (substituted in the RUN line)
set -u
tpc=$1 filecheck=$2 file=$3
shift 3
run=$(grep -m1 '^// RUN:' "$file" | sed 's|^// RUN:[[:space:]]*||')
if [ -z "$run" ]; then
  echo "$file: no '// RUN:' line" >&2
  exit 2
fi
for subst in "$@"; do
  run=${run//"${subst%%=*}"/"${subst#*=}"}
done
read -ra args <<<"$run"
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
"$tpc" opt "$file" "${args[@]}" >"$out" 2>"$err"
rc=$?
if [ $rc -ne 0 ]; then
  echo "FAIL: tpc opt $file $run exited with $rc; stderr:" >&2
  cat "$err" >&2
  exit 1
fi
cat "$err" "$out" | "$filecheck" "$file" --dump-input=fail
