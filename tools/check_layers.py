#!/usr/bin/env python3
"""The layering check (docs/architecture.md): every `#include "LAYER/..."` under src/ must name a
layer the including file's layer may use. Exit 0 when the tree is clean, 1 with one line per
violation (file:line: LAYER includes OTHER/...: allowed ...) otherwise.

    tools/check_layers.py [SRC_DIR]      (default: the src/ beside this script)

The rules are the table below. A layer always includes its own files. An include without a
directory ("jinja_ast.h") must name a file beside the includer; an include whose first component
is not a layer (a generated file, a system header written with quotes) is an error too, so a new
directory under src/ cannot escape the check: it has to be given a rule here first.
"""
import os
import re
import sys

# layer -> the other layers it may include (downward only).
ALLOWED = {
    "util": set(),
    "model": {"util"},
    "io": {"util", "model"},
    "tokenizer": {"util", "model"},
    "chat": {"util", "model"},
    "grammar": {"util", "model"},
    "cpu": {"util", "model"},
    "cuda": {"util", "model"},
    "engine": {"util", "model", "tokenizer", "chat", "grammar"},
    "bench": {"util", "model"},
    "server": {"util", "model", "tokenizer", "chat", "grammar", "engine"},
    # The one place that opens a checkpoint and picks a backend: sees io, cpu and cuda together.
    "runtime": {"util", "model", "io", "tokenizer", "chat", "grammar", "cpu", "cuda", "engine"},
    # The binary: every layer but the backends, which it reaches through runtime (nothing else
    # includes cli/).
    "cli": {"util", "model", "io", "tokenizer", "chat", "grammar", "engine", "bench", "server",
            "runtime"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".in")


def check(src):
    violations = []
    for root, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src)
            layer = rel.split(os.sep)[0]
            if layer not in ALLOWED:
                violations.append(f"{rel}: directory '{layer}' has no rule in {__file__}")
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = m.group(1)
                    where = f"{rel}:{lineno}"
                    if "/" not in target:
                        if not os.path.exists(os.path.join(root, target)):
                            violations.append(f"{where}: \"{target}\" is neither a layer's file "
                                              "nor beside the includer")
                        continue
                    other = target.split("/")[0]
                    if other == layer:
                        continue
                    if other not in ALLOWED:
                        violations.append(f"{where}: \"{target}\": '{other}' is not a layer")
                    elif other not in ALLOWED[layer]:
                        allowed = ", ".join(sorted(ALLOWED[layer])) or "nothing else"
                        violations.append(f"{where}: {layer} includes {target} "
                                          f"({layer} may include {allowed})")
    return violations


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "src")
    if not os.path.isdir(src):
        print(f"check_layers: {src} is not a directory", file=sys.stderr)
        return 2
    violations = check(src)
    if violations:
        print(f"check_layers: {len(violations)} include(s) break the layering "
              "(rules: tools/check_layers.py, docs/architecture.md):", file=sys.stderr)
        for v in violations:
            print("  " + v, file=sys.stderr)
        return 1
    print("check_layers: every include under src/ follows the layering")
    return 0


if __name__ == "__main__":
    sys.exit(main())
