#!/usr/bin/env python3
"""Whether kernels compiled from two versions of a source are the same instructions: used when a
kernel moves between src/cuda and the kernel lab (bench/lab), or is specialised (a template
parameter folded in), to show that the move changed no maths (docs/kernels.md, "Kernel lab").

    nvcc -Isrc -O3 -DNDEBUG -arch=sm_90a --expt-relaxed-constexpr -std=c++17 -ptx OLD.cu -o old.ptx
    nvcc ... -ptx NEW.cu -o new.ptx
    tools/ptx_same.py old.ptx new.ptx 'OLD_REGEX|NEW_REGEX|DROPPED' ...

Each pair names one .entry in each file by a regex over its mangled name; DROPPED lists the
indices (comma-separated, may be empty) of parameters of the old kernel that the new one no longer
has (they must not be referenced). The bodies are compared after renaming what a move or a
specialisation renumbers: parameters (by position), branch labels, the local depot, mangled
symbols and virtual registers (by order of first use). Exit 0 when every pair is the same.
"""
import difflib
import re
import sys


def entries(path):
    text = open(path).read()
    starts = [m.start() for m in re.finditer(r"(?:\.visible )?\.entry ", text)] + [len(text)]
    out = []
    for a, b in zip(starts, starts[1:]):
        m = re.match(r"(?:\.visible )?\.entry (\S+)\(\n(.*?)\n\)\n(.*)", text[a:b], re.S)
        body = m.group(3).rstrip()
        out.append((m.group(1), m.group(2), body[: body.rindex("}")]))
    return out


def normalised(params, body, dropped):
    plist = [p.strip().rstrip(",") for p in params.split("\n") if p.strip()]
    keep = [i for i in range(len(plist)) if i not in dropped]

    def param(m):
        i = int(m.group(1))
        return f"PARAM{keep.index(i)}" if i in keep else "DROPPED"

    b = re.sub(r"_Z\w+_param_(\d+)", param, body)
    b = re.sub(r"_Z\w+", "SYM", b)
    b = re.sub(r"\$L__BB\d+_", "$L__BB_", b)
    b = re.sub(r"__local_depot\d+", "__local_depot", b)
    b = re.sub(r"\.reg \.\w+ \t%\w+<\d+>;", "REGDECL", b)
    seen, count = {}, {}

    def reg(m):
        if m.group(0) not in seen:
            count[m.group(1)] = count.get(m.group(1), 0) + 1
            seen[m.group(0)] = f"%{m.group(1)}#{count[m.group(1)]}"
        return seen[m.group(0)]

    b = re.sub(r"%(rd|fd|rs|r|f|p|h)\d+", reg, b)
    types = [re.sub(r"\S+$", "", plist[i]) for i in keep]
    return types, b


def one(entries_list, pattern):
    found = [e for e in entries_list if re.search(pattern, e[0])]
    if len(found) != 1:
        sys.exit(f"{pattern}: {len(found)} kernels match (want 1)")
    return found[0]


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    old, new = entries(sys.argv[1]), entries(sys.argv[2])
    differ = 0
    for spec in sys.argv[3:]:
        old_re, new_re, dropped = spec.split("|")
        dropped = {int(x) for x in dropped.split(",") if x}
        _, op, ob = one(old, old_re)
        _, np_, nb = one(new, new_re)
        t_old, b_old = normalised(op, ob, dropped)
        t_new, b_new = normalised(np_, nb, set())
        same = t_old == t_new and b_old == b_new and "DROPPED" not in b_old
        print(f"{'same' if same else 'DIFFERENT'}: {old_re} vs {new_re} ({len(b_old.splitlines())} lines)")
        if not same:
            differ += 1
            diff = difflib.unified_diff(b_old.splitlines(), b_new.splitlines(), lineterm="")
            for line in list(diff)[:40]:
                print("   ", line)
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
