#!/usr/bin/env bash
# Runs the libFuzzer targets (fuzz/) for a bounded time each, under ASan+UBSan (the `asan` preset's
# build, which also builds lilac_fuzz_*). New inputs go to a scratch corpus (the committed seeds in
# fuzz/corpus/<name> are read, never written); a crash, sanitizer report, leak or timeout stops
# that target, leaves its input in build/fuzz-artifacts/ and fails the script. Turn each finding
# into a regression input: fix it, then copy the artifact to fuzz/regressions/<name>/ (the replay
# test tests/fuzz/corpus_replay_test.cpp runs it in every build from then on).
#
#   tools/fuzz.sh [seconds per target (default 60)] [target ...]   (targets: all by default)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${1:-60}"
shift || true
TARGETS=("$@")
if [ "${#TARGETS[@]}" -eq 0 ]; then TARGETS=(safetensors model_config request tokenizer jinja); fi
BUILD=build/asan
ARTIFACTS=build/fuzz-artifacts
mkdir -p "$ARTIFACTS"
ulimit -s 65536 2>/dev/null || true  # ASan frames are large; see tools/test.sh
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
for t in "${TARGETS[@]}"; do
  bin="$BUILD/fuzz/lilac_fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz: $bin is not built (cmake --preset asan; cmake --build --preset asan)"; exit 2; }
  scratch="$(mktemp -d)"
  dict=()
  case "$t" in request | model_config | safetensors) dict=(-dict=fuzz/json.dict) ;; esac
  echo "== fuzz $t: ${SECONDS_EACH}s"
  if ! "$bin" "$scratch" "fuzz/corpus/$t" "fuzz/regressions/$t" "${dict[@]}" \
      -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$ARTIFACTS/$t-" 2>&1 | tail -n 40; then
    echo "fuzz $t: FOUND A PROBLEM (input in $ARTIFACTS/)"
    status=1
  fi
  rm -rf "$scratch"
done
exit $status
