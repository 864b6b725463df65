#!/usr/bin/env bash
# Error-corpus driver: `tpc opt FILE <ARGS>` must exit with exactly 1, print nothing on stdout and exactly
# one stderr line equal to FILE's `// ERROR:` line (FILE in it stands for the input's path).
# usage: run_error.sh TPC FILE [%name=value ...]   (substituted in the ARGS and ERROR lines)
set -u
tpc=$1 file=$2
shift 2
expected=$(grep -m1 '^// ERROR: ' "$file" | sed 's|^// ERROR: ||')
argline=$(grep -m1 '^// ARGS:' "$file" | sed 's|^// ARGS:[[:space:]]*||')
if [ -z "$expected" ]; then
  echo "$file: no '// ERROR:' line" >&2
  exit 2
fi
expected=${expected//FILE/$file}
for subst in "$@"; do
  expected=${expected//"${subst%%=*}"/"${subst#*=}"}
  argline=${argline//"${subst%%=*}"/"${subst#*=}"}
done
read -ra args <<<"$argline"
out=$(mktemp) err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
"$tpc" opt "$file" "${args[@]}" >"$out" 2>"$err"
rc=$?
fail=0
if [ $rc -ne 1 ]; then echo "FAIL: exit code $rc, expected 1" >&2; fail=1; fi
if [ -s "$out" ]; then echo "FAIL: stdout is not empty:" >&2; cat "$out" >&2; fail=1; fi
lines=$(wc -l <"$err")
if [ "$lines" -ne 1 ]; then echo "FAIL: stderr has $lines lines, expected exactly 1" >&2; fail=1; fi
actual=$(cat "$err")
if [ "$actual" != "$expected" ]; then
  echo "FAIL: stderr differs" >&2
  echo "  expected: $expected" >&2
  echo "  actual:   $actual" >&2
  fail=1
fi
exit $fail
