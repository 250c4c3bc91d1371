#!/usr/bin/env bash
# Installs what lilac builds and tests with, from Debian 12 packages (idempotent).
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  nlohmann-json3-dev libcpp-httplib-dev libpcre2-dev libcli11-dev libfmt-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
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
# Node.js (>= 20) runs the real-client tests (tests/clients); Debian 12's own is 18.
if ! command -v node >/dev/null 2>&1; then
  $SUDO apt-get install -y -qq nodejs npm
fi
