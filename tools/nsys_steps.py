#!/usr/bin/env python3
"""Where a decode step's time goes on the GPU's own timeline: reads an Nsight Systems export
(`nsys profile -t cuda --cuda-graph-trace=node ...`, then `nsys export --type sqlite`) or the
kernel list of tools/cupti/cupti_trace.cpp (a .tsv: start_ns, end_ns, demangled name) and splits
each step (a run of kernels from an embedding kernel to the next) into per-kernel *exposed* time.

ncu times each kernel alone, serialised, with its launch ramp; inside a CUDA graph under PDL the
next kernel's blocks start while the previous one drains, so the durations add up to more than
the step. Here a kernel's exposed time is the part of its [start, end) that no earlier kernel of
the step covers: the exposed times plus the idle gaps add up to the step's wall time exactly.

    tools/nsys_steps.py PROFILE.sqlite|KERNELS.tsv [--first-kernel embed] [--skip 5] [--top 30]

Prints, over the steps after the first --skip (warm-up), the mean step wall time, its idle gaps,
and per kernel name (template arguments kept): calls per step, mean duration, mean exposed
time per step, and "early": per call, how long the kernel ran before the kernels started ahead
of it had all ended (under PDL: its blocks resident, mostly waiting, in the previous kernel's
tail; a window for work that does not depend on that kernel). Only steps whose kernel count is
the most common one are used (one batch size), or with --largest the largest count seen at
least 3 times (a prompt chunk of a prefill bench). A malformed .tsv line is named and refused.

--sequence N then lists the step's first N kernels in launch order (the steps used all run the
same kernels in the same order), each position's means over the steps: start after the step's
first kernel started, duration, exposed and early time. Where the table above says a kernel
costs more, this says next to what: the kernel before it, and whether its blocks started early
(s44: in_proj at one split ran ~9 us longer inside the step than alone).
"""
import argparse
import collections
import re
import sqlite3
import sys


def short(name):
    """A kernel's name without namespaces, return type or parameters; template arguments kept
    (without spaces), so that the instances of one template (q_gemm_wgmma's forms) stay apart."""
    name = name.replace("(anonymous namespace)::", "")
    if name.endswith(")"):  # drop the parameter list: the parentheses that close at the end
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = re.sub(r"[A-Za-z_][A-Za-z_0-9]*::", "", name)  # namespaces, here and in the arguments
    depth, last_space = 0, -1
    for i, ch in enumerate(name):  # the return type ends at the last space outside the brackets
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == " " and depth == 0:
            last_space = i
    return name[last_space + 1:].replace(" ", "")


def read_sqlite(path):
    con = sqlite3.connect(path)
    return con.execute(
        "SELECT k.start, k.end, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = COALESCE(k.demangledName, k.shortName) ORDER BY k.start"
    ).fetchall()


def read_tsv(path):
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            parts = line.rstrip("\n").split("\t", 2)
            if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
                sys.exit("%s:%d: not 'start_ns<TAB>end_ns<TAB>name': %r" %
                         (path, number, line[:80]))
            rows.append((int(parts[0]), int(parts[1]), parts[2]))
    return sorted(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("--first-kernel", default="embed", help="substring of a step's first kernel")
    ap.add_argument("--skip", type=int, default=5, help="warm-up steps left out")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--largest", action="store_true",
                    help="the largest step size seen at least 3 times (a prompt chunk) instead of "
                    "the most common one (a decode step)")
    ap.add_argument("--sequence", type=int, default=0,
                    help="then the step's first N kernels in order, per position")
    a = ap.parse_args()

    rows = read_tsv(a.db) if a.db.endswith(".tsv") else read_sqlite(a.db)
    if not rows:
        sys.exit("no kernels in " + a.db)

    steps, cur = [], None
    for start, end, name in rows:
        n = short(name)
        if a.first_kernel in n:
            cur = []
            steps.append(cur)
        if cur is not None:
            cur.append((start, end, n))
    sizes = collections.Counter(len(s) for s in steps)
    if not sizes:
        sys.exit("no step starts with a kernel named like '%s'" % a.first_kernel)
    size = sizes.most_common(1)[0][0]
    if a.largest:
        size = max([n for n, count in sizes.items() if count >= 3] or [size])
    use = [s for s in steps if len(s) == size][a.skip:]
    if not use:
        sys.exit("too few steps of %d kernels after --skip %d" % (size, a.skip))

    calls = collections.Counter()
    dur = collections.Counter()
    exposed = collections.Counter()
    early = collections.Counter()
    # per position in the step: start offset, duration, exposed, early (sums over the steps)
    pos = [[0, 0, 0, 0] for _ in range(size)]
    wall = gaps = 0
    for s in use:
        covered = s[0][0]
        for i, (start, end, n) in enumerate(s):
            calls[n] += 1
            dur[n] += end - start
            if start > covered:
                gaps += start - covered
            e = max(0, end - max(start, covered))
            b = max(0, min(covered, end) - start)
            exposed[n] += e
            early[n] += b
            for j, v in enumerate((start - s[0][0], end - start, e, b)):
                pos[i][j] += v
            covered = max(covered, end)
        wall += covered - s[0][0]
    k = len(use)
    print("%d steps of %d kernels (of %d steps; sizes %s)" % (k, size, len(steps), dict(sizes)))
    print("step wall %.1f us, idle gaps %.1f us, kernel durations sum %.1f us" %
          (wall / k / 1e3, gaps / k / 1e3, sum(dur.values()) / k / 1e3))
    print("%-48s %7s %10s %12s %7s %9s" %
          ("kernel", "calls", "mean us", "exposed us", "share", "early us"))
    for n, e in exposed.most_common(a.top):
        print("%-48s %7.1f %10.2f %12.1f %6.1f%% %9.2f" %
              (n[:48], calls[n] / k, dur[n] / calls[n] / 1e3, e / k / 1e3, 100.0 * e / wall,
               early[n] / calls[n] / 1e3))
    if a.sequence > 0:
        print("the step's first %d kernels in order (means over the steps)" %
              min(a.sequence, size))
        print("%4s %-48s %9s %9s %9s %9s" %
              ("pos", "kernel", "start us", "dur us", "exposed", "early us"))
        for i in range(min(a.sequence, size)):
            print("%4d %-48s %9.2f %9.2f %9.2f %9.2f" %
                  ((i, use[0][i][2][:48]) + tuple(v / k / 1e3 for v in pos[i])))


if __name__ == "__main__":
    main()
