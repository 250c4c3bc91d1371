#!/usr/bin/env bash
# Runs ON THE GPU MACHINE over a copy of the repository with .device-build/ carried (see
# tools/gpu-build.sh). Steps (default: tests logits bench):
#   tests       GPU kernel and backend tests (lilac_cuda_tests, label gpu)
#   tests-switches
#               the same suite with LILAC_GDN_TF32_SPLIT=trunc LILAC_PREFILL_MOE_Y_BF16=1 set. Caveat
#               (s34): a kernel switch read from the environment (the tf32 split) reaches every
#               test, a CudaOptions one (y-bf16) only backends built from the environment's options,
#               not the many tests that pass explicit CudaOptions: to judge a CudaOptions default,
#               build with the default changed and run `tests`
#   logits      the tiny-a fixture through `lilac logits --device cuda` (both layouts, chunked)
#   kernels     the kernel microbenchmarks (lilac_cuda_bench_*, the kernel lab among them)
#   lab         the kernel lab alone (lilac_cuda_bench_lab: every version of each op in bench/lab,
#               checked against the CPU twin and timed; fails when a check fails)
#   bench       `lilac bench --synthetic` (ten lengths, 3 rounds); bench-short: 3 lengths, 1 round;
#               bench-q4: the same in 4-bit weights (bench-q4-short: 3 lengths, 1 round)
#   bench-q4-zipf-short
#               bench-q4-short with the skewed (zipf) synthetic router, JSON to bench-q4-zipf.json
#   ab          decode at 256 context under each A/B switch of CudaOptions (LILAC_PDL=0,
#               LILAC_CUDA_GRAPHS=0), bf16 and q4
#   grammar     structured output: the constrained decode cost (ConstrainedStep.DISABLED_DecodeCostQ4,
#               4-bit, batch 1) and the grammar mask benchmark on this machine's CPU
#   tokenizer   tokenizer throughput: lilac's Google Benchmark and HF tokenizers, same file
#   batch       the batched decode step: its GPU tests, then its bench (BatchBench.*, disabled in
#               the plain test run: B = 1..64 at 1024 context, BF16 and 4-bit, per-kernel split)
#   concurrency `lilac bench --synthetic --concurrency 1,2,4,8,16,32,64`, BF16 and 4-bit (JSON each)
#   steps       the batched decode step on the GPU's timeline at c = 16 and 64 (tools/gpu-steps.sh:
#               nsys or the CUPTI tracer, per-kernel exposed time; 4-bit, bf16 GDN state)
#   prefill-ab  this build against a base build (the tarball $BASE_BUILD, made by tools/gpu-build.sh
#               from the base commit and carried beside this one): lilac_cuda_bench_seq of each, then
#               4-bit prefill at 256 / 512 / 1,024 / 4,096 tokens, three interleaved rounds
#   gdn-chunk-ab
#               gdn_chunk at one block per SM against two (LILAC_GDN_CHUNK_BLOCKS = 1 | 2, s31):
#               lilac_cuda_bench_seq under each, then 4-bit prefill at 256 / 512 / 1,024 / 4,096 /
#               16,384 tokens, three interleaved rounds
#   prefill-norm-ab
#               prompt chunks' MoE combine writing the next layer's input norm
#               (LILAC_PREFILL_COMBINE_NORM = 0 | 1, s31; on by default since s32): its same-bits
#               test, then 4-bit prefill at 256 / 512 / 1,024 / 4,096 tokens under each, three
#               interleaved rounds
#   moe-y-ab    prompt chunks' routed expert outputs in bf16 instead of f32 (LILAC_PREFILL_MOE_Y_BF16
#               = 0 | 1, s32): its tests, then 4-bit prefill at 256 / 512 / 1,024 / 4,096 / 16,384
#               tokens under each, three interleaved rounds
#   tf32-split-ab
#               the GDN state pass's 3xTF32 split rounded or truncated (LILAC_GDN_TF32_SPLIT =
#               round | trunc, s32; trunc the default since s34): its tolerance test, lilac_cuda_bench_seq under each, then
#               4-bit prefill at 256 / 512 / 1,024 / 4,096 / 16,384 tokens, three interleaved rounds
#   attn-ab     attention_prefill versions 1-5 (LILAC_ATTN_PREFILL = mma | wgmma | wgmma-overlap |
#               wgmma-ws | wgmma-pingpong; wgmma-overlap the default since s34): the layout test and
#               every version's conformance cases, lilac_cuda_bench_seq (times each version), then
#               4-bit prefill at 4,096 / 16,384 / 65,536 tokens under each but wgmma, three
#               interleaved rounds
#   route-ab    moe_route's one-cluster form for 65-512 rows (LILAC_MOE_ROUTE_CLUSTER = off | on,
#               s37): the routing, MoE prefill, batch and prefill GPU tests, then 4-bit prefill at
#               128 / 256 / 512 tokens under each (three interleaved rounds)
#   streamk-ab  q_gemm_wgmma's stream-K form (LILAC_Q4_GEMM_STREAMK = off | auto, s35; off the
#               default, measured slower): its conformance cases first, then 4-bit prefill at 256 /
#               512 / 1,024 / 4,096 tokens under each, three interleaved rounds
#   ncu-proj    Nsight Compute (--set full) over the first 8 q_gemm_wgmma launches of a 256-token
#               4-bit prefill (in_proj / out_proj of three GDN layers, qkv / o_proj of one attention
#               layer; with LILAC_Q4_GEMM_STREAMK=auto the stream-K kernel's, whose name contains
#               q_gemm_wgmma): what bounds the projections at short chunks (s35 run 6)
#   ncu-sk      Nsight Compute (--set full) over two launches of the stream-K form at 256 tokens
#               (LILAC_Q4_GEMM_STREAMK=auto): details in run.log, the per-instruction SASS table
#               with stall samples to $OUT/ncu-sk-sass.csv.xz, the report to $OUT/ncu-sk.ncu-rep
#   ncu-route   Nsight Compute (--set full) over the routing chain of a 256-token 4-bit prompt chunk
#               (moe_topk then the one-block rank / scan / scatter, two layers' launches each; and the
#               one-cluster form), fine stall sampling: where their ~8.8 / ~10 us go (s37)
#   ncu-short   Nsight Compute (--set full, fine stall sampling, caches not flushed) over a
#               256-token 4-bit prompt chunk's attention prefill, rms_norm and moe_combine launches
#               (s46: where attention's 25 us per layer go): details in run.log, the per-instruction
#               SASS table with stall samples to $OUT/ncu-short-sass.csv.xz
#   prompt-moe-ab
#               144 / 192 / 256-token prompts under LILAC_PROMPT_MOE = automatic | small (s46), three
#               interleaved rounds
#   dequant-ab  the wgmma prefill kernels' dequantisation, one FMA per pair against two
#               (LILAC_Q4_PREFILL_DEQUANT = two-fma | one-fma, s49): the seq bench under each, then
#               4-bit prefill at 256 / 512 / 1,024 / 4,096 tokens, three interleaved rounds
#   prefill-short
#               4-bit prefill at 256 / 512 tokens, 3 rounds (JSON prefill-short.json)
#   split-ab    the small-M projections' split pick and placement (s44; run in s45): 4-bit c = 8 /
#               16 / 32 (bf16 GDN state) under LILAC_Q4_SMALL_COST = block | sm, each with and
#               without LILAC_Q4_GEMM_PDL=off, all with LILAC_Q4_SMALL_SPREAD=off, and sm with the
#               spread (one block per SM for un-clustered launches of at most one block per SM; sm +
#               spread the default since s45), three interleaved rounds (JSONs in split-ab.tar.xz);
#               then the 16-row step's timeline under block, sm and sm + spread (steps16-<arm>.txt,
#               the first 30 kernels in order)
#   tests-split the GPU suite under the pre-s45 small-M pick (LILAC_Q4_SMALL_COST=block
#               LILAC_Q4_SMALL_SPREAD=off), the A/B arm
#   persistent-lab
#               kernel lab q_moe_small version 7 (s44; run in s45: lost): the expert pair as one
#               persistent launch, checked, and timed as pairs against production's unchained and
#               chained pairs at T = 16, 64, 256, 512
#   ncu-c16     Nsight Compute (--set full) over the batched 16-row decode step's small-M
#               kernels: the 16-token q_gemm_wgmma form (in_proj, out_proj) and the chained expert
#               pair, two layers' launches each, fine stall sampling: details in run.log, the
#               per-instruction SASS table with stall samples to $OUT/ncu-c16-sass.csv.xz (s44)
#   chained-ab  the chained small-M expert pair (LILAC_SMALL_MOE_KERNEL = registers | chained,
#               s41-s44; chained the default since s44): its kernel and backend tests, then 4-bit
#               c = 16 / 64 (bf16 GDN state) under each, three interleaved rounds (their JSONs in
#               chained-ab.tar.xz)
#   concurrency-q4-bf16state
#               the 4-bit concurrency sweep at c = 1, 16, 64 with the bf16 GDN state
#   serve-q4, serve-bf16
#               `lilac serve --synthetic` driven over HTTP by bench/serve_bench.mjs (1024 tokens in,
#               1024 out, streaming) at each of $SERVE_CONCURRENCY (q4 default "1 16 64", bf16 "16");
#               node is $NODE (default: node on the PATH; the GPU image has none, so carry one);
#               $SERVE_ARGS: more `lilac serve` flags (e.g. "--step-tokens 4096")
# Everything is logged to $OUT/run.log (few files: the device tool brings back at most 8), a
# one-line-per-step summary to $OUT/summary.txt, bench results to $OUT/bench.json.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
steps=${*:-tests logits bench}
status=0
run() {  # name, timeout seconds, command...
  local name=$1 limit=$2
  shift 2
  echo "=== $name: $*" | tee -a "$OUT/summary.txt" >>"$OUT/run.log"
  local t0=$(date +%s)
  timeout "$limit" "$@" >>"$OUT/run.log" 2>&1
  local rc=$?
  echo "    $name rc=$rc ($(($(date +%s) - t0)) s)" | tee -a "$OUT/summary.txt" | tee -a "$OUT/run.log"
  [ $rc -eq 0 ] || status=1
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
# The build's own commit (git describe at configure time; the device copy's .git can be stale).
"$B/lilac" --version >>"$OUT/summary.txt" 2>&1 || true
# An A/B over one environment switch: `switch_ab NAME VAR LENGTHS SEQ VALUE...`. With SEQ = 1,
# lilac_cuda_bench_seq under each value first; then three interleaved rounds of 4-bit prefill at
# LENGTHS under each value.
switch_ab() {
  local name=$1 var=$2 lengths=$3 seq=$4 v round
  shift 4
  if [ "$seq" = 1 ]; then
    for v in "$@"; do run "$name-seq-$v" 120 env "$var=$v" "$B/lilac_cuda_bench_seq"; done
  fi
  for round in 1 2 3; do
    for v in "$@"; do
      run "$name-$v-$round" 180 env "$var=$v" "$B/lilac" bench --synthetic --weights q4 \
        --lengths "$lengths" --rounds 1 --decode 1 --sampling off
    done
  done
}
# Serves the synthetic model in `$1` weights and runs the HTTP serving bench at each concurrency.
serve_bench() {
  local w=$1 levels=$2 port=8091 pid
  "$B/lilac" serve --synthetic --weights "$w" --tokenizer tests/data/tokenizer/qwen3-tokenizer.json.gz \
    --port $port --parallel 64 --ctx-size 2304 \
    --queue 256 ${SERVE_ARGS:-} >>"$OUT/serve-$w.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/health')" \
      2>/dev/null && break
    sleep 1
  done
  for c in $levels; do
    local n=$c
    [ "$c" -lt 4 ] && n=4
    run "serve-$w-c$c" 200 "${NODE:-node}" bench/serve_bench.mjs --url "http://127.0.0.1:$port" \
      --concurrency "$c" --requests "$n" --input-tokens 1024 --output-tokens 1024 \
      --json "$OUT/serve-$w-c$c.json"
    cat "$OUT/serve-$w-c$c.json" >>"$OUT/run.log" 2>/dev/null
    # The server's own split of the time after this level (cumulative over the levels so far):
    # steps, the engine's gaps between them, snapshots (docs/batching.md, "Metrics").
    echo "metrics after serve-$w-c$c:" >>"$OUT/run.log"
    curl -s "http://127.0.0.1:$port/metrics" 2>/dev/null |
      grep -E '^lilac_(batch_size|step|snapshot|running|slots)' >>"$OUT/run.log" || true
  done
  kill -TERM "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
}

# The GPU suite (`gpu_tests NAME [env VAR=VALUE ...]`), which fails on any skip: a GPU test that
# skipped (no device, a path this GPU lacks) did not test anything. gtest's summary says "[
# SKIPPED ] N tests." (--gtest_brief) or "[  SKIPPED ] N tests, listed below:" when N > 0,
# nothing when none skipped.
gpu_tests() {
  local name=$1 from skipped
  shift
  from=$(($(wc -l 2>/dev/null <"$OUT/run.log" || echo 0) + 1))
  run "$name" 420 "$@" "$B/lilac_cuda_tests" --gtest_brief=1
  skipped=$(tail -n +"$from" "$OUT/run.log" |
    sed -n 's/^\[  SKIPPED \] \([0-9][0-9]*\) tests\{0,1\}[.,].*/\1/p' | tail -n 1)
  echo "    $name: ${skipped:-0} skipped" | tee -a "$OUT/summary.txt"
  if [ "${skipped:-0}" -ne 0 ]; then
    echo "    $name: FAIL, $skipped GPU tests were skipped (see run.log)" | tee -a "$OUT/summary.txt"
    status=1
  fi
}

for s in $steps; do
  case $s in
    tests) gpu_tests gpu-tests ;;
    tests-split)
      gpu_tests gpu-tests-split env LILAC_Q4_SMALL_COST=block LILAC_Q4_SMALL_SPREAD=off ;;
    tests-switches)
      gpu_tests gpu-tests-switches env LILAC_GDN_TF32_SPLIT=trunc LILAC_PREFILL_MOE_Y_BF16=1 ;;
    logits)
      for m in tiny-a tiny-a-per-expert; do
        run "logits-$m" 60 "$B/lilac" logits --model "tests/data/$m" --prompt-from tests/data/tiny-a/reference.safetensors \
          --decode 16 --device cuda --rope-freq-bf16 --compare tests/data/tiny-a/reference.safetensors --atol 5e-2
      done
      run logits-chunked 60 "$B/lilac" logits --model tests/data/tiny-a --prompt-from tests/data/tiny-a/reference.safetensors \
        --decode 16 --device cuda --rope-freq-bf16 --prefill-chunk 7 --compare tests/data/tiny-a/reference.safetensors --atol 5e-2 ;;
    kernels)
      for b in $(cd "$B" && ls -d lilac_cuda_bench_* 2>/dev/null); do run "$b" 180 "$B/$b"; done ;;
    lab) run lab 180 "$B/lilac_cuda_bench_lab" ;;
    bench) run bench 540 "$B/lilac" bench --synthetic --json "$OUT/bench.json" ;;
    bench-q4) run bench-q4 420 "$B/lilac" bench --synthetic --weights q4 --json "$OUT/bench-q4.json" ;;
    ab)  # decode at 256 context under the A/B switches of CudaOptions, both formats (the L2
      # prefetch hints, a measured loser, are compared by lilac_cuda_bench_kernels' layer section)
      for w in bf16 q4; do
        for e in LILAC_NONE=1 LILAC_PDL=0 LILAC_CUDA_GRAPHS=0 LILAC_Q_GEMV_STAGED=0 LILAC_MOE_SHARED_FUSED=0 LILAC_COMBINE_NORM=0 LILAC_MOE_PDL=0 LILAC_GEMV_ROWS_STAGED=0; do
          run "ab-$w-$e" 120 env "$e" "$B/lilac" bench --synthetic --weights "$w" --lengths 256 --rounds 1
        done
      done ;;
    bench-q4-short) run bench-q4 240 "$B/lilac" bench --synthetic --weights q4 --lengths 256,4096,32768 --rounds 1 --json "$OUT/bench-q4.json" ;;
    bench-q4-zipf-short) run bench-q4-zipf 240 "$B/lilac" bench --synthetic --weights q4 --router zipf --lengths 256,4096,32768 --rounds 1 --json "$OUT/bench-q4-zipf.json" ;;
    bench-short) run bench 240 "$B/lilac" bench --synthetic --lengths 256,4096,32768 --rounds 1 --json "$OUT/bench.json" ;;
    batch)
      run batch-tests 240 "$B/lilac_cuda_tests" --gtest_filter='BatchKernels.*:BatchBackend.*'
      run batch-bench 240 "$B/lilac_cuda_tests" --gtest_also_run_disabled_tests \
        --gtest_filter='BatchBench.*' ;;
    concurrency)
      for w in bf16 q4; do
        run "concurrency-$w" 240 "$B/lilac" bench --synthetic --weights "$w" \
          --concurrency 1,2,4,8,16,32,64 --json "$OUT/concurrency-$w.json"
      done ;;
    prefill-ab)
      if [ ! -f "${BASE_BUILD:-}" ]; then
        echo "    prefill-ab: FAIL, \$BASE_BUILD (a tarball of the base build) not found" | tee -a "$OUT/summary.txt"
        status=1
        continue
      fi
      rm -rf /tmp/base && mkdir -p /tmp/base && tar -C /tmp/base -xJf "$BASE_BUILD"
      BB=/tmp/base/.device-build
      run prefill-ab-seq-base 120 env LD_LIBRARY_PATH="$BB/lib" "$BB/lilac_cuda_bench_seq"
      run prefill-ab-seq-this 120 "$B/lilac_cuda_bench_seq"
      for round in 1 2 3; do
        run "prefill-ab-base-$round" 120 env LD_LIBRARY_PATH="$BB/lib" "$BB/lilac" bench --synthetic \
          --weights q4 --lengths 256,512,1024,4096 --rounds 1 --decode 1 --sampling off
        run "prefill-ab-this-$round" 120 "$B/lilac" bench --synthetic --weights q4 \
          --lengths 256,512,1024,4096 --rounds 1 --decode 1 --sampling off
      done ;;
    gdn-chunk-ab) switch_ab gdn-chunk LILAC_GDN_CHUNK_BLOCKS 256,512,1024,4096,16384 1 1 2 ;;
    tf32-split-ab)
      run tf32-split-test 300 "$B/lilac_cuda_tests" --gtest_filter='GdnPrefill.BothTf32Splits*'
      switch_ab tf32-split LILAC_GDN_TF32_SPLIT 256,512,1024,4096,16384 1 round trunc ;;
    moe-y-ab)
      run moe-y-test 300 "$B/lilac_cuda_tests" \
        --gtest_filter='Q4Moe.DownBf16RowsAreTheF32RowsRounded:Q4Backend.PrefillMoeYBf16*'
      switch_ab moe-y LILAC_PREFILL_MOE_Y_BF16 256,512,1024,4096,16384 0 0 1 ;;
    prefill-norm-ab)
      run prefill-norm-test 300 "$B/lilac_cuda_tests" --gtest_filter='Q4Backend.PrefillCombineNormGivesTheSameBits'
      switch_ab prefill-norm LILAC_PREFILL_COMBINE_NORM 256,512,1024,4096 0 0 1 ;;
    attn-ab)
      run attn-test 300 "$B/lilac_cuda_tests" \
        --gtest_filter='WgmmaLayout.*:*attention_prefill*:*attention_chain*:AttentionPrefill.*'
      run attn-seq 120 "$B/lilac_cuda_bench_seq"
      switch_ab attn LILAC_ATTN_PREFILL 4096,16384,65536 0 mma wgmma-overlap wgmma-ws wgmma-pingpong ;;
    route-ab)  # moe_route's cluster (s37) against the top-k kernel then the one-block sort
      run route-test 300 "$B/lilac_cuda_tests" --gtest_filter='*moe_route*:*moe_prefill*:*Batch*:*Prefill*'
      switch_ab route LILAC_MOE_ROUTE_CLUSTER 128,256,512 0 off on ;;
    streamk-ab)
      run streamk-test 300 "$B/lilac_cuda_tests" --gtest_filter='*q_gemm*streamk*:*q_gemm*scratch*:Q4Gemm.*'
      switch_ab streamk LILAC_Q4_GEMM_STREAMK 256,512,1024,4096 0 off auto ;;
    ncu-proj)
      run ncu-proj 300 ncu --set full --cache-control all --clock-control none \
        -k 'regex:q_gemm_wgmma' --launch-count 8 "$B/lilac" bench --synthetic --weights q4 \
        --lengths 256 --rounds 1 --decode 1 --sampling off ;;
    ncu-sk)  # the stream-K form's own profile (s36): its first two launches of the prefill chunk,
      # the report, its details page in run.log and the per-instruction SASS table (stall samples)
      run ncu-sk 300 env LILAC_Q4_GEMM_STREAMK=auto ncu --set full --cache-control all \
        --clock-control none -k 'regex:streamk' --launch-count 2 -o "$OUT/ncu-sk" "$B/lilac" bench \
        --synthetic --weights q4 --lengths 256 --rounds 1 --decode 1 --sampling off
      run ncu-sk-details 60 ncu --import "$OUT/ncu-sk.ncu-rep" --page details
      run ncu-sk-sass 120 sh -c "ncu --import '$OUT/ncu-sk.ncu-rep' --page source --csv \
        --print-source sass | xz > '$OUT/ncu-sk-sass.csv.xz'" ;;
    ncu-route)  # the routing kernels' own profile (s37): 256-token chunk, each form, fine sampling
      for v in on off; do
        run ncu-route-$v 300 env LILAC_MOE_ROUTE_CLUSTER=$v ncu --set full --warp-sampling-interval 0 \
          --cache-control all --clock-control none -k 'regex:moe_route|moe_topk' --launch-skip 8 \
          --launch-count 4 -o "$OUT/ncu-route-$v" "$B/lilac" bench --synthetic --weights q4 \
          --lengths 256 --rounds 1 --decode 1 --sampling off
        run ncu-route-$v-details 60 ncu --import "$OUT/ncu-route-$v.ncu-rep" --page details
        run ncu-route-$v-sass 120 sh -c "ncu --import '$OUT/ncu-route-$v.ncu-rep' --page source \
          --csv --print-source sass | xz > '$OUT/ncu-route-$v-sass.csv.xz'"
      done ;;
    dequant-ab)  # the wgmma prefill kernels' one-FMA dequantisation (s49) against the two-FMA
      # form (LILAC_Q4_PREFILL_DEQUANT = two-fma | one-fma): the seq bench under each, then 4-bit
      # prefill at 256 / 512 / 1,024 / 4,096 tokens, three interleaved rounds
      switch_ab dequant LILAC_Q4_PREFILL_DEQUANT 256,512,1024,4096 1 two-fma one-fma ;;
    prompt-moe-ab)  # prompts of 144-256 tokens: the small-M expert pair (chained since s44) against
      # rows32 (LILAC_PROMPT_MOE = automatic | small, s46; the rule's last measurement, s21,
      # predates the chain), three interleaved rounds
      for round in 1 2 3; do
        for v in automatic small; do
          run "prompt-moe-$v-$round" 120 env LILAC_PROMPT_MOE=$v "$B/lilac" bench --synthetic \
            --weights q4 --lengths 144,192,256 --rounds 1 --decode 1 --sampling off
        done
      done ;;
    ncu-short)  # a 256-token prompt chunk's short-T kernels (s46): attention prefill (25 us per
      # layer on 32 blocks), the post-mixer rms_norm and the combine, two layers' launches each.
      # s47: with the caches flushed (--cache-control all) 79% of attention's stall samples were
      # its epilogue's serialised gate loads from DRAM, which the engine finds in L2 (pipelining
      # them gained 2 us of ~26 warm); so warm caches, as the chunk runs, and the SASS table
      run ncu-short 300 ncu --set full --warp-sampling-interval 0 --cache-control none \
        --clock-control none -k 'regex:attn_prefill|rms_norm|moe_combine' --launch-skip 12 \
        --launch-count 6 -o "$OUT/ncu-short" "$B/lilac" bench --synthetic --weights q4 \
        --lengths 256 --rounds 1 --decode 1 --sampling off
      run ncu-short-details 60 ncu --import "$OUT/ncu-short.ncu-rep" --page details
      run ncu-short-sass 120 sh -c "ncu --import '$OUT/ncu-short.ncu-rep' --page source --csv \
        --print-source sass | xz > '$OUT/ncu-short-sass.csv.xz'" ;;
    persistent-lab) run persistent-lab 240 "$B/lilac_cuda_bench_lab" --op q_moe_small --version 7 ;;
    split-ab)  # the small-M split pick per SM and one block per SM under PDL (s44, item 6)
      mkdir -p "$OUT/split-ab"
      arms="block sm block-nopdl sm-nopdl sm-spread"
      for round in 1 2 3; do
        for v in $arms; do
          e=(LILAC_Q4_SMALL_COST=${v%%-*} LILAC_Q4_SMALL_SPREAD=off)
          [ "${v#*-}" = nopdl ] && e+=(LILAC_Q4_GEMM_PDL=off)
          [ "${v#*-}" = spread ] && e+=(LILAC_Q4_SMALL_SPREAD=on)
          run "split-ab-$v-$round" 120 env "${e[@]}" "$B/lilac" bench --synthetic --weights q4 \
            --gdn-state bf16 --concurrency 8,16,32 --json "$OUT/split-ab/$v-$round.json"
        done
      done
      tar -C "$OUT" -cJf "$OUT/split-ab.tar.xz" split-ab && rm -rf "$OUT/split-ab"
      for v in block sm sm-spread; do
        e=(LILAC_Q4_SMALL_COST=${v%%-*} LILAC_Q4_SMALL_SPREAD=off)
        [ "${v#*-}" = spread ] && e+=(LILAC_Q4_SMALL_SPREAD=on)
        run "split-steps-$v" 120 env "${e[@]}" "$(dirname "$0")/gpu-steps.sh" 16
        mv "$OUT/steps16.txt" "$OUT/steps16-$v.txt"
        rm -f "$OUT/trace16.log"
      done ;;
    ncu-c16)  # the c = 16 step's small-M projections and expert pair (s44). Demangled names read
      # "QGemmV2Cfg<(int)16, (int)8, (int)3>" (s44 run 6: a pattern without the casts matched none)
      run ncu-c16 300 ncu --set full --warp-sampling-interval 0 --cache-control all \
        --clock-control none --kernel-name-base demangled \
        -k 'regex:QGemmV2Cfg<.int.16|q_moe_small_(gate_up|down)_kernel' --launch-count 8 \
        -o "$OUT/ncu-c16" "$B/lilac" bench --synthetic --weights q4 --gdn-state bf16 --concurrency 16
      run ncu-c16-details 60 ncu --import "$OUT/ncu-c16.ncu-rep" --page details
      run ncu-c16-sass 120 sh -c "ncu --import '$OUT/ncu-c16.ncu-rep' --page source --csv \
        --print-source sass | xz > '$OUT/ncu-c16-sass.csv.xz'" ;;
    prefill-short)  # 4-bit prefill at 256 / 512 tokens (#11's short-prompt targets), three rounds
      run prefill-short 180 "$B/lilac" bench --synthetic --weights q4 --lengths 256,512 --rounds 3 \
        --decode 1 --sampling off --json "$OUT/prefill-short.json" ;;
    chained-ab)  # the chained pair (s41-s43): its tests, then c = 16 / 64 under each arm
      run chained-tests 240 "$B/lilac_cuda_tests" --gtest_brief=1 \
        --gtest_filter='*Chained*:*chained*:Q4MoeSmall.*:CudaOptions*'
      mkdir -p "$OUT/chained-ab"
      for round in 1 2 3; do
        for v in registers chained; do
          run "chained-ab-$v-$round" 120 env LILAC_SMALL_MOE_KERNEL=$v "$B/lilac" bench --synthetic \
            --weights q4 --gdn-state bf16 --concurrency 16,64 --json "$OUT/chained-ab/$v-$round.json"
        done
      done
      # One file for the six JSONs (the device tool brings back at most 8).
      tar -C "$OUT" -cJf "$OUT/chained-ab.tar.xz" chained-ab && rm -rf "$OUT/chained-ab" ;;
    concurrency-q4-bf16state)  # #11's c = 16 / 64 figures of record: 4-bit, bf16 GDN state
      run concurrency-q4-bf16state 300 "$B/lilac" bench --synthetic --weights q4 --gdn-state bf16 \
        --concurrency 1,16,64 --json "$OUT/concurrency-q4-bf16state.json" ;;
    steps) run steps 300 "$(dirname "$0")/gpu-steps.sh" 16 64 ;;
    serve-q4) serve_bench q4 "${SERVE_CONCURRENCY:-1 16 64}" ;;
    serve-bf16) serve_bench bf16 "${SERVE_CONCURRENCY:-16}" ;;
    grammar)
      run constrained-cost 120 "$B/lilac_cuda_tests" --gtest_also_run_disabled_tests \
        --gtest_filter='ConstrainedStep.DISABLED_DecodeCostQ4'
      run grammar-mask 120 "$B/grammar_mask_bench" 10 120 ;;
    tokenizer)
      run tokenizer-lilac 60 "$B/tokenizer_bench" --benchmark_min_time=1
      run tokenizer-hf 60 python3 tools/hf_tokenizer_speed.py tests/data/tokenizer/qwen3-tokenizer.json.gz \
        tests/data/tokenizer/tok_bench.txt ;;
  esac
done
echo "overall: $([ $status -eq 0 ] && echo PASS || echo FAIL)" | tee -a "$OUT/summary.txt"
exit $status
