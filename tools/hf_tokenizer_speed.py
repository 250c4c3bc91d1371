#!/usr/bin/env python3
"""HF `tokenizers` encode throughput on a file, single-threaded: the comparison point for lilac's
tokenizer_bench (run both on the same machine, same file). Usage: hf_tokenizer_speed.py TOKENIZER_JSON[.gz] TEXT"""
import gzip
import os
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

path, text_path = sys.argv[1], sys.argv[2]
raw = gzip.open(path, "rb").read() if path.endswith(".gz") else open(path, "rb").read()
t0 = time.perf_counter()
tok = Tokenizer.from_str(raw.decode("utf-8"))
load_s = time.perf_counter() - t0
text = open(text_path, encoding="utf-8").read()
nbytes = len(text.encode("utf-8"))
best = float("inf")
for _ in range(5):
    t0 = time.perf_counter()
    ids = tok.encode(text, add_special_tokens=False).ids
    best = min(best, time.perf_counter() - t0)
print(f"hf tokenizers: load {load_s:.3f} s; encode {nbytes} bytes -> {len(ids)} ids in {best:.4f} s "
      f"(best of 5) = {nbytes / best / 1e6:.2f} MB/s single-threaded")
