#!/usr/bin/env python3
"""Tests of tools/check_layers.py: it passes a tree that follows the layering and fails, naming
file, line and rule, on each kind of violation (an upward include, a peer backend, cli included
from below, a directory without a rule, a bare include of a file that is not beside the
includer). Each case builds a small src/ tree in a temporary directory."""
import os
import subprocess
import sys
import tempfile
import unittest

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                     "check_layers.py")


def run_check(files):
    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "src")
        for rel, text in files.items():
            path = os.path.join(src, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        p = subprocess.run([sys.executable, CHECK, src], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr


CLEAN = {
    "util/error.h": "#pragma once\n",
    "model/config.h": '#include "util/error.h"\n',
    "io/checkpoint.h": '#include "model/config.h"\n#include <vector>\n',
    "cpu/linear.cpp": '#include "cpu/linear.h"\n#include "model/config.h"\n',
    "cpu/linear.h": "#pragma once\n",
    "cuda/gemm.cu": '#include "gemm.cuh"\n#include "model/config.h"\n',
    "cuda/gemm.cuh": "#pragma once\n",
    "runtime/backends.cpp": '#include "cpu/linear.h"\n#include "io/checkpoint.h"\n',
    "cli/serve.cpp": '#include "runtime/backends.h"\n#include "cli/command.h"\n',
}


class CheckLayers(unittest.TestCase):
    def test_clean_tree_passes(self):
        rc, out = run_check(CLEAN)
        self.assertEqual(rc, 0, out)
        self.assertIn("follows the layering", out)

    def test_upward_include_fails(self):
        rc, out = run_check({**CLEAN, "model/backend.h": '#pragma once\n#include "cpu/linear.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("model/backend.h:2: model includes cpu/linear.h (model may include util)",
                      out)

    def test_peer_backends_and_io_are_refused_to_cuda(self):
        rc, out = run_check({**CLEAN, "cuda/device_model.cpp":
                             '#include "cpu/linear.h"\n#include "io/checkpoint.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("cuda/device_model.cpp:1: cuda includes cpu/linear.h", out)
        self.assertIn("cuda/device_model.cpp:2: cuda includes io/checkpoint.h", out)
        self.assertIn("2 include(s) break the layering", out)

    def test_server_may_not_see_a_backend_nor_cli(self):
        rc, out = run_check({**CLEAN, "server/server.h": '#include "cuda/gemm.cuh"\n',
                             "engine/engine.h": '  #  include "cli/serve.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("server/server.h:1: server includes cuda/gemm.cuh", out)
        self.assertIn("engine/engine.h:1: engine includes cli/serve.h", out)

    def test_directory_without_a_rule_fails(self):
        rc, out = run_check({**CLEAN, "newlayer/x.cpp": '#include "util/error.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn("directory 'newlayer' has no rule", out)

    def test_bare_include_must_be_beside_the_includer(self):
        rc, out = run_check({**CLEAN, "model/x.cpp": '#include "linear.h"\n'})
        self.assertEqual(rc, 1, out)
        self.assertIn('model/x.cpp:1: "linear.h" is neither a layer\'s file', out)

    def test_the_repository_itself_passes(self):
        p = subprocess.run([sys.executable, CHECK], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)


if __name__ == "__main__":
    unittest.main()
