#!/usr/bin/env bash
# Runs ON THE GPU MACHINE over a copy of the repository with .device-build/ carried (see
# tools/gpu-build.sh): GPU kernel tests, the tiny-a fixture through `lilac logits --device cuda`,
# the synthetic full-size model checks, and the benchmark. Logs go to $OUT (or ./gpu-out).
#   tools/gpu-check.sh [tests] [logits] [bench] [kernels]   (default: all)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
B=.device-build
export LD_LIBRARY_PATH="$PWD/$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LILAC_TEST_DATA="$PWD/tests/data"
steps=${*:-tests logits bench}
status=0
run() {  # name, command...: runs, logs to $OUT/name.log, remembers failures
  local name=$1; shift
  echo "=== $name: $*" | tee -a "$OUT/summary.txt"
  local t0=$(date +%s)
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "    rc=$rc ($(( $(date +%s) - t0 )) s)" | tee -a "$OUT/summary.txt"
  tail -n 15 "$OUT/$name.log"
  [ $rc -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
git log -1 --format='commit %H %s' >>"$OUT/summary.txt" 2>/dev/null || true
for s in $steps; do
  case $s in
    tests) run gpu-tests "$B/lilac_cuda_tests" --gtest_brief=1 ;;
    logits)
      for m in tiny-a tiny-a-per-expert; do
        run "logits-$m" "$B/lilac" logits --model "tests/data/$m" --prompt-from tests/data/tiny-a/reference.safetensors \
          --decode 16 --device cuda --rope-freq-bf16 --compare tests/data/tiny-a/reference.safetensors --atol 5e-2
      done
      run logits-chunked "$B/lilac" logits --model tests/data/tiny-a --prompt-from tests/data/tiny-a/reference.safetensors \
        --decode 16 --device cuda --rope-freq-bf16 --prefill-chunk 7 --compare tests/data/tiny-a/reference.safetensors --atol 5e-2 ;;
    kernels)
      for b in $(cd "$B" && ls -d lilac_cuda_bench_* 2>/dev/null); do
        [ -x "$B/$b" ] && run "$b" "$B/$b"
      done ;;
    bench) run bench "$B/lilac" bench --synthetic --json "$OUT/bench.json" ;;
    bench-short) run bench "$B/lilac" bench --synthetic --lengths 256,4096,32768 --rounds 1 --json "$OUT/bench.json" ;;
  esac
done
echo "overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)" | tee -a "$OUT/summary.txt"
exit $status
