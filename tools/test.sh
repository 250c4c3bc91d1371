#!/usr/bin/env bash
# The test command: checks the include layering (tools/check_layers.py), installs dependencies,
# builds with warnings as errors (CUDA sources too when nvcc is present), and runs every test that
# needs no GPU; then the same CPU suite under
# ASan+UBSan (the `asan` preset: clang, one tree that also builds the libFuzzer targets) and each
# fuzz target for LILAC_FUZZ_SECONDS (default 60; 0 skips the sanitizer stage).
set -euo pipefail
cd "$(dirname "$0")/.."
# The layering of src/ (docs/architecture.md): seconds, so first.
python3 tools/check_layers.py
tools/install-deps.sh
cmake --preset ci
cmake --build --preset ci
ctest --preset ci -j "$(nproc)"

FUZZ_SECONDS="${LILAC_FUZZ_SECONDS:-60}"
if [ "$FUZZ_SECONDS" != "0" ]; then
  cmake --preset asan
  cmake --build --preset asan
  # ASan's frames are several times larger: the Jinja engine's recursion bound (kMaxEvalDepth)
  # overflows the default 8 MiB stack before it triggers. 64 MiB for this stage's processes and
  # their threads (glibc sizes thread stacks from this limit).
  (
    ulimit -s 65536
    ctest --preset asan -j "$(nproc)"
    tools/fuzz.sh "$FUZZ_SECONDS"
  )
fi
