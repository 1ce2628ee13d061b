#!/usr/bin/env bash
# Installs every Debian package Strata's build, tests, examples and benchmarks
# need. Idempotent: packages already present are left alone. Installs as root
# (through sudo when run by another user).
set -euo pipefail

packages=(
  bazel-bootstrap pkg-config g++ bc procps
  libprotobuf-dev protobuf-compiler
  libabsl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgloo-dev redis-server
  libopenblas-dev libdnnl-dev zlib1g-dev libgoogle-perftools-dev
  nlohmann-json3-dev
  dataset-fashion-mnist
)
# The reference for numeric cross-checks and benchmarks, without its recommends.
reference=(python3-torch python3-numpy)

missing=()
for p in "${packages[@]}" "${reference[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all packages present"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then exec sudo "$0" "$@"; fi
  echo "install_deps: missing ${missing[*]}; run as root" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${packages[@]}" >/dev/null
apt-get install -y -qq --no-install-recommends "${reference[@]}" >/dev/null
echo "install_deps: installed ${missing[*]}"
