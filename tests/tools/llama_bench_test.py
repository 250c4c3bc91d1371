#!/usr/bin/env python3
"""bench/peers/llama_bench.sh (the single-stream protocol on llama.cpp's llama-bench) against a
stand-in llama-bench: a script that checks the arguments it is given (the protocol's commands)
and prints llama-bench's JSONL record with a rate derived from them. The real tool needs a GPU
and a llama.cpp build, which this repository does not make; what is tested here is the driver:
the commands per length, the parsing, the means, and the errors."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "peers", "llama_bench.sh")

# Prefill -p L -n 0 (depth 0) answers 10000 + L tok/s, decode -p 0 -n 64 -d L answers 300 - L/1000;
# any other combination of the protocol's flags exits 3.
FAKE = r'''#!/usr/bin/env python3
import json, sys
a = sys.argv[1:]
def val(flag, default=None):
    return a[a.index(flag) + 1] if flag in a else default
ok = (val("-fa") == "1" and val("-ngl") == "99" and val("-r") == "3" and val("-o") == "jsonl"
      and val("-m") is not None)
p, n, d = int(val("-p", "512")), int(val("-n", "128")), int(val("-d", "0"))
if not ok or not ((n == 0 and d == 0 and p > 0) or (p == 0 and n == 64 and d > 0)):
    sys.exit(3)
ts = 10000.0 + p if n == 0 else 300.0 - d / 1000.0
print("noise that is not a record")
print(json.dumps({"build_commit": "abc123", "gpu_info": "Fake GPU", "n_prompt": p, "n_gen": n,
                  "n_depth": d, "avg_ts": ts}))
'''


class LlamaBenchDriver(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.fake = os.path.join(self.tmp.name, "llama-bench")
        with open(self.fake, "w") as f:
            f.write(FAKE)
        os.chmod(self.fake, 0o755)
        self.model = os.path.join(self.tmp.name, "model.gguf")
        open(self.model, "w").close()
        self.out = os.path.join(self.tmp.name, "out.json")

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, *args):
        return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True)

    def test_protocol_and_means(self):
        r = self.run_script(self.fake, self.model, self.out, "256,4096")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.load(open(self.out))
        self.assertEqual(doc["engine"], "llama.cpp abc123")
        self.assertEqual(doc["gpu"], "Fake GPU")
        self.assertEqual([x["context"] for x in doc["results"]], [256, 4096])
        self.assertEqual([x["prefill_tok_s"] for x in doc["results"]], [10256.0, 14096.0])
        self.assertEqual([x["decode_tok_s"] for x in doc["results"]], [299.744, 295.904])
        self.assertAlmostEqual(doc["mean"]["prefill_tok_s"], 12176.0)
        self.assertAlmostEqual(doc["mean"]["decode_tok_s"], 297.824)
        self.assertEqual(len(doc["records"]), 4)
        self.assertIn("mean", r.stdout)

    def test_tool_failure_fails(self):
        env = dict(os.environ, LLAMA_BENCH_FA="on")  # the stand-in accepts only 1
        r = subprocess.run(["bash", SCRIPT, self.fake, self.model, self.out, "256"],
                           capture_output=True, text=True, env=env)
        self.assertNotEqual(r.returncode, 0)
        self.assertFalse(os.path.exists(self.out))

    def test_bad_arguments(self):
        self.assertEqual(self.run_script().returncode, 2)
        r = self.run_script(os.path.join(self.tmp.name, "missing"), self.model)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not an executable", r.stderr)
        r = self.run_script(self.fake, os.path.join(self.tmp.name, "missing.gguf"))
        self.assertEqual(r.returncode, 2)
        self.assertIn("no model file", r.stderr)


if __name__ == "__main__":
    unittest.main()
