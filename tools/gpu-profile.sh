#!/usr/bin/env bash
# Runs ON THE GPU MACHINE (after tools/gpu-build.sh, like gpu-check.sh): Nsight Compute over the
# kernels of decode steps of the synthetic model at 256 context, un-graphed (LILAC_CUDA_GRAPHS=0:
# ncu then sees plain launches), one CSV row per kernel with its time, DRAM bytes and throughput.
# Usage: tools/gpu-profile.sh [bf16|q4] [launch count]   -> $OUT/ncu-<weights>.csv
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
weights=${1:-bf16}
count=${2:-260}
# Decode-only kernels (the prefill runs GEMMs; its one lm_head GEMV per prompt is skipped by
# --launch-skip).
kernels='regex:gemv_kernel|moe_down|moe_gate_up|gdn_decode|attn_decode|moe_router|rms_norm|router_topk|argmax'
LILAC_CUDA_GRAPHS=0 ncu --csv --page raw --cache-control all --clock-control none -k "$kernels" \
  --launch-skip 340 --launch-count "$count" \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,sm__warps_active.avg.pct_of_peak_sustained_active \
  "$B/lilac" bench --synthetic --weights "$weights" --lengths 256 --rounds 1 --decode 8 \
  >"$OUT/ncu-$weights.csv" 2>"$OUT/ncu-$weights.log"
echo "ncu rc=$? ($(wc -l <"$OUT/ncu-$weights.csv") lines)"
