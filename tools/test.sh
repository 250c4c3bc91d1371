#!/usr/bin/env bash
# The test command: installs dependencies, builds with warnings as errors (CUDA sources too when
# nvcc is present), and runs every test that needs no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install-deps.sh
cmake --preset ci
cmake --build --preset ci
ctest --preset ci -j "$(nproc)"
