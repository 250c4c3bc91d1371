#!/usr/bin/env bash
# Runs ON THE GPU MACHINE (after tools/gpu-build.sh, like gpu-check.sh): the batched decode step on
# the GPU's own timeline, every kernel of the bench's CUDA graphs with its start and end (so PDL's
# overlaps are seen as they happen, which ncu's serialised per-kernel times cannot show), and
# tools/nsys_steps.py splits each step into per-kernel exposed time and idle gaps. The timeline
# comes from Nsight Systems when the machine has it, else from tools/cupti/cupti_trace.cpp (a
# CUPTI injection library built here against the machine's CUPTI).
# Usage: tools/gpu-steps.sh [item ...]   (default 16 64; 4-bit weights, bf16 GDN state)
#   an item is a concurrency (the batched decode step; 1 is the single-stream step) or p<N>, a
#   prompt chunk of N tokens (the prefill bench at that length, its chunks' timeline)
#   -> $OUT/steps<item>.txt (with the step's first $STEPS_SEQUENCE kernels in order, default 30:
#   nsys_steps.py --sequence), $OUT/trace<item>.log
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
TOOLS="$PWD/tools"
[ $# -gt 0 ] || set -- 16 64
NSYS=$(command -v nsys || ls -d /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys \
  /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda*/nsight-systems*/bin/nsys 2>/dev/null |
  head -1)
CUPTI_LIB=/tmp/libcupti_trace.so
if [ -z "$NSYS" ]; then  # build the CUPTI tracer
  INC=$(dirname "$(find /usr/local /opt /usr/include /usr/lib -name cupti.h 2>/dev/null | head -1)")
  [ -f "$INC/cupti.h" ] || { echo "neither nsys nor CUPTI's headers found"; exit 1; }
  LIBDIR=$(dirname "$(find "$INC/.." "$INC/../.." -name 'libcupti.so*' 2>/dev/null | head -1)")
  LIBCUPTI=$(ls "$LIBDIR"/libcupti.so* | head -1)
  RECORD=$(grep -ho 'CUpti_ActivityKernel[0-9]\+' "$INC"/cupti_activity*.h | sort -Vu | tail -1)
  echo "CUPTI: $INC, $LIBCUPTI, $RECORD"
  g++ -O2 -shared -fPIC -I"$INC" -DKERNEL_RECORD="$RECORD" "$TOOLS/cupti/cupti_trace.cpp" \
    "$LIBCUPTI" -Wl,-rpath,"$LIBDIR" -o "$CUPTI_LIB" || exit 1
fi
for c in "$@"; do
  pick=()
  if [[ $c == p* ]]; then
    run_bench=("$B/lilac" bench --synthetic --weights q4 --gdn-state bf16 --lengths "${c#p}"
      --rounds 8 --decode 1 --sampling off)
    pick=(--largest --skip 2)
  else
    run_bench=("$B/lilac" bench --synthetic --weights q4 --gdn-state bf16 --concurrency "$c")
  fi
  if [ -n "$NSYS" ]; then
    timeout 150 "$NSYS" profile -t cuda --cuda-graph-trace=node -o "/tmp/steps$c" -f true \
      "${run_bench[@]}" >"$OUT/trace$c.log" 2>&1
    echo "nsys profile c=$c rc=$?"
    timeout 120 "$NSYS" export --type sqlite -o "/tmp/steps$c.sqlite" -f true \
      "/tmp/steps$c.nsys-rep" >>"$OUT/trace$c.log" 2>&1
    TRACE=/tmp/steps$c.sqlite
  else
    TRACE=/tmp/steps$c.tsv
    CUDA_INJECTION64_PATH=$CUPTI_LIB LILAC_CUPTI_OUT=$TRACE timeout 150 "${run_bench[@]}" \
      >"$OUT/trace$c.log" 2>&1
    echo "cupti trace c=$c rc=$? ($(wc -l <"$TRACE") kernels)"
  fi
  python3 "$TOOLS/nsys_steps.py" "$TRACE" --top 40 --sequence "${STEPS_SEQUENCE:-30}" "${pick[@]}" |
    tee "$OUT/steps$c.txt"
done
