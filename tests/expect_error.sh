# Sourced by the argument tests (bench_args.sh, gemm_bench_args.sh): `expect_error WANT ARGS...` runs the
# command in the array `cmd` with ARGS and counts a failure in `failures` unless it exits 1 with one stderr line
# containing WANT.
failures=0
expect_error() {
  local want="$1"
  shift
  local err rc
  err="$("${cmd[@]}" "$@" 2>&1 >/dev/null)"
  rc=$?
  if [ "$rc" -ne 1 ] || [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] || [[ "$err" != *"$want"* ]]; then
    echo "FAIL: ${cmd[*]##*/} $*: exit $rc, stderr: $err (expected exit 1 and one line with: $want)"
    failures=$((failures + 1))
  else
    echo "ok: ${cmd[*]##*/} $* -> $err"
  fi
}
