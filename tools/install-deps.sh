#!/usr/bin/env bash
# Installs what lilac builds and tests with, from Debian 12 packages (idempotent).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  nlohmann-json3-dev libcpp-httplib-dev libpcre2-dev libcli11-dev libfmt-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev  # the sanitizer build and the libFuzzer runtime (tools/fuzz.sh)
  curl ca-certificates
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq "${missing[@]}"
fi
# Node.js (>= 18, so Debian 12's own will do) and npm run the real-client tests (tests/clients).
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  missing_node=()
  command -v node >/dev/null 2>&1 || missing_node+=(nodejs)
  command -v npm >/dev/null 2>&1 || missing_node+=(npm)
  $SUDO apt-get install -y -qq "${missing_node[@]}"
fi
