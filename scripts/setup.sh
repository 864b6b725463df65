#!/usr/bin/env bash
# Installs everything tpc needs on a fresh Debian 12 machine. Idempotent: safe to run again.
set -euo pipefail
pkgs=(build-essential cmake ninja-build git
      libflatbuffers-dev flatbuffers-compiler
      catch2 llvm-14-dev llvm-14-tools nlohmann-json3-dev zlib1g-dev libzstd-dev libtinfo-dev libncurses-dev)
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
