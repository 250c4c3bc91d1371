#!/usr/bin/env bash
# The single-stream protocol of docs/benchmarking.md section 1, run on llama.cpp's own benchmark
# tool, so that a figure quoted for llama.cpp comes with the commands that produce it
# (docs/benchmarking.md, "Peers"). It does not build llama.cpp: give it a built `llama-bench`
# (CUDA, sm_90) and a GGUF of the model (the figures in the docs used a 4.5-bit Q4_0 GGUF).
#
#   bench/peers/llama_bench.sh LLAMA_BENCH MODEL.gguf [OUT.json] [LENGTHS]
#
# Per context length L (default the protocol's ten, 256 .. 131,072):
#   prefill: `llama-bench -p L -n 0` (prompt processing of L tokens at depth 0): tok/s as printed
#   decode:  `llama-bench -p 0 -n 64 -d L` (64 generated tokens after a context of L): tok/s
# both with flash attention on, every layer on the GPU, default batch sizes, 3 repetitions
# (llama-bench reports their mean). LLAMA_BENCH_FA overrides the -fa value (builds that spell it
# on / off / auto). Writes one JSON document: the tool's own JSONL records under
# "records", and per length {context, prefill_tok_s, decode_tok_s} with the means over the lengths
# under "results" / "mean", the shape `lilac bench --json` uses for the same fields.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
bin=$1
model=$2
out=${3:-llama-bench.json}
lengths=${4:-256,512,1024,2048,4096,8192,16384,32768,65536,131072}
[ -x "$bin" ] || { echo "llama_bench.sh: $bin is not an executable" >&2; exit 2; }
[ -f "$model" ] || { echo "llama_bench.sh: no model file $model" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(-m "$model" -fa "${LLAMA_BENCH_FA:-1}" -ngl 99 -r 3 -o jsonl)
IFS=, read -r -a Ls <<<"$lengths"
for L in "${Ls[@]}"; do
  echo "llama_bench.sh: context $L" >&2
  "$bin" "${common[@]}" -p "$L" -n 0 >"$tmp/pp-$L.jsonl"
  "$bin" "${common[@]}" -p 0 -n 64 -d "$L" >"$tmp/tg-$L.jsonl"
done
python3 - "$tmp" "$out" "$lengths" "$bin" "$model" <<'EOF'
import json, sys, os
tmp, out, lengths, binary, model = sys.argv[1:]
def record(path):
    rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    if len(rows) != 1:
        sys.exit(f"llama_bench.sh: expected one record in {path}, found {len(rows)}")
    return rows[0]
records, results = [], []
for L in (int(x) for x in lengths.split(",")):
    pp, tg = record(f"{tmp}/pp-{L}.jsonl"), record(f"{tmp}/tg-{L}.jsonl")
    records += [pp, tg]
    results.append({"context": L, "prefill_tok_s": pp["avg_ts"], "decode_tok_s": tg["avg_ts"]})
mean = lambda k: sum(r[k] for r in results) / len(results)
doc = {
    "engine": "llama.cpp " + str(records[0].get("build_commit", "?")),
    "gpu": records[0].get("gpu_info", ""),
    "model": os.path.basename(model),
    "protocol": "docs/benchmarking.md section 1 on llama-bench: prefill -p L -n 0, decode -p 0 "
                "-n 64 -d L; -fa 1 -ngl 99 -r 3",
    "results": results,
    "mean": {"prefill_tok_s": mean("prefill_tok_s"), "decode_tok_s": mean("decode_tok_s")},
    "records": records,
}
json.dump(doc, open(out, "w"), indent=1)
print(f"{'context':>8} {'prefill tok/s':>14} {'decode tok/s':>13}")
for r in results:
    print(f"{r['context']:>8} {r['prefill_tok_s']:>14.1f} {r['decode_tok_s']:>13.1f}")
print(f"{'mean':>8} {doc['mean']['prefill_tok_s']:>14.1f} {doc['mean']['decode_tok_s']:>13.1f}")
EOF
