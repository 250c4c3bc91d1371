#!/usr/bin/env bash
# Runs ON THE GPU MACHINE (after tools/gpu-build.sh, like gpu-check.sh): the batched decode step on
# the GPU's own timeline. Nsight Systems traces the bench's CUDA graphs node by node (so PDL's
# overlaps are seen as they happen, which ncu's serialised per-kernel times cannot show), and
# tools/nsys_steps.py splits each step into per-kernel exposed time and idle gaps.
# Usage: tools/gpu-steps.sh [concurrency ...]   (default 16 64; 4-bit weights, bf16 GDN state)
#   -> $OUT/steps<c>.txt, $OUT/nsys<c>.log
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
NSYS=$(command -v nsys || ls -d /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys \
  /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "nsys not found"; exit 1; }
[ $# -gt 0 ] || set -- 16 64
for c in "$@"; do
  timeout 150 "$NSYS" profile -t cuda --cuda-graph-trace=node -o "/tmp/steps$c" -f true \
    "$B/lilac" bench --synthetic --weights q4 --gdn-state bf16 --concurrency "$c" >"$OUT/nsys$c.log" 2>&1
  echo "profile c=$c rc=$?"
  timeout 120 "$NSYS" export --type sqlite -o "/tmp/steps$c.sqlite" -f true "/tmp/steps$c.nsys-rep" \
    >>"$OUT/nsys$c.log" 2>&1
  python3 "$(dirname "$0")/nsys_steps.py" "/tmp/steps$c.sqlite" --top 40 | tee "$OUT/steps$c.txt"
done
