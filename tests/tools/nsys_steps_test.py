#!/usr/bin/env python3
"""Tests of tools/nsys_steps.py on small Nsight Systems exports built here (the two tables it
reads, as `nsys export --type sqlite` lays them out): a step's exposed times and idle gaps add up
to its wall time, overlapped kernels count only their uncovered part, warm-up steps and steps of
another size are left out, and an export without kernels fails."""
import os
import sqlite3
import subprocess
import sys
import tempfile
import unittest

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                    "nsys_steps.py")
US = 1000  # the export's times are nanoseconds


def export(path, kernels):
    """kernels: (start_us, end_us, demangled name)."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT NOT NULL, end INT NOT NULL, "
                "deviceId INT NOT NULL, demangledName INT NOT NULL, shortName INT NOT NULL)")
    ids = {}
    for start, end, name in kernels:
        if name not in ids:
            ids[name] = len(ids) + 1
            con.execute("INSERT INTO StringIds VALUES (?, ?)", (ids[name], name))
        con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, ?)",
                    (start * US, end * US, ids[name], ids[name]))
    con.commit()
    con.close()


def tsv(path, kernels):
    """tools/cupti/cupti_trace.cpp's format, written out of start order (the tool sorts)."""
    with open(path, "w") as f:
        for start, end, name in reversed(kernels):
            f.write("%d\t%d\t%s\n" % (start * US, end * US, name))


def run(kernels, *args, fmt="sqlite"):
    with tempfile.TemporaryDirectory() as d:
        db = os.path.join(d, "p." + fmt)
        (export if fmt == "sqlite" else tsv)(db, kernels)
        p = subprocess.run([sys.executable, TOOL, db, *args], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr


def step(t0, gap=5):
    # embed [0, 10); gemm [8, 20): 2 us under embed; idle gap; moe [20 + gap, 40 + gap).
    return [(t0, t0 + 10, "void (anonymous namespace)::q_embed_kernel(int const*)"),
            (t0 + 8, t0 + 20, "void qgemm::q_gemm_kernel<qgemm::Cfg<16, 8, 3>, 2>(float*)"),
            (t0 + 20 + gap, t0 + 40 + gap, "void (anonymous namespace)::moe_kernel<4>(int)")]


class NsysStepsTest(unittest.TestCase):
    def test_exposed_times_and_gaps_add_up(self):
        rc, out = run(step(0) + step(100) + step(200), "--skip", "1")
        self.assertEqual(rc, 0, out)
        self.assertIn("2 steps of 3 kernels", out)
        self.assertIn("step wall 45.0 us, idle gaps 5.0 us, kernel durations sum 42.0 us", out)
        rows = {l.split()[0]: l.split() for l in out.splitlines()[3:]}
        self.assertEqual(rows["q_embed_kernel"][3], "10.0")
        self.assertEqual(rows["q_gemm_kernel<Cfg<16,8,3>,2>"][2], "12.00")  # its whole duration
        # less the 2 us under the embed
        self.assertEqual(rows["q_gemm_kernel<Cfg<16,8,3>,2>"][3], "10.0")
        self.assertEqual(rows["moe_kernel<4>"][3], "20.0")
        # early: the gemm started 2 us before the embed ended; the moe after an idle gap
        self.assertEqual(rows["q_gemm_kernel<Cfg<16,8,3>,2>"][5], "2.00")
        self.assertEqual(rows["moe_kernel<4>"][5], "0.00")

    def test_sequence_lists_each_position_in_order(self):
        # The third step's moe starts 4 us later (gap 9): the position means are over the two
        # steps used (gaps 5 and 9: the moe starts at 27 us on average).
        rc, out = run(step(0) + step(100) + step(200, gap=9), "--skip", "1", "--sequence", "5")
        self.assertEqual(rc, 0, out)
        lines = out.splitlines()
        i = lines.index([l for l in lines if l.startswith("the step's first")][0])
        self.assertEqual(lines[i], "the step's first 3 kernels in order (means over the steps)")
        rows = [l.split() for l in lines[i + 2:i + 5]]
        self.assertEqual([r[1] for r in rows],
                         ["q_embed_kernel", "q_gemm_kernel<Cfg<16,8,3>,2>", "moe_kernel<4>"])
        self.assertEqual(rows[1][2:], ["8.00", "12.00", "10.00", "2.00"])
        self.assertEqual(rows[2][2:], ["27.00", "20.00", "20.00", "0.00"])
        self.assertEqual(len(lines), i + 5)  # N beyond the step's size: its kernels only

    def test_cupti_trace_tsv_reads_like_the_export(self):
        kernels = step(0) + step(100) + step(200)
        rc, out = run(kernels, "--skip", "1", fmt="tsv")
        self.assertEqual(rc, 0, out)
        self.assertEqual(out, run(kernels, "--skip", "1")[1])
        self.assertIn("step wall 45.0 us, idle gaps 5.0 us", out)
        rc, out = run([], "--skip", "0", fmt="tsv")
        self.assertNotEqual(rc, 0)
        self.assertIn("no kernels", out)

    def test_largest_picks_the_prompt_chunks(self):
        chunk = lambda t0: step(t0) + [(t0 + 50, t0 + 90, "gdn_prefill_kernel")]
        five = lambda t0: step(t0) + [(t0 + 45, t0 + 46, "x"), (t0 + 46, t0 + 47, "y")]
        kernels = (chunk(0) + chunk(100) + chunk(200) + step(300) + step(400) + step(500) +
                   step(600) + five(700) + five(800))
        rc, out = run(kernels, "--skip", "0", "--largest")
        self.assertEqual(rc, 0, out)
        self.assertIn("3 steps of 4 kernels", out)  # not the 5-kernel steps, seen twice
        self.assertIn("gdn_prefill_kernel", out)
        rc, out = run(kernels, "--skip", "0")
        self.assertIn("4 steps of 3 kernels", out)

    def test_malformed_tsv_line_is_named(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "k.tsv")
            with open(path, "w") as f:
                f.write("100\t200\tq_embed_kernel\n12x\t300\tmoe_kernel\n")
            p = subprocess.run([sys.executable, TOOL, path], capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("k.tsv:2: not 'start_ns<TAB>end_ns<TAB>name'", p.stderr)
        self.assertNotIn("Traceback", p.stderr)

    def test_other_step_sizes_are_left_out(self):
        odd = step(300) + [(345, 350, "void rms_norm_kernel<1>(float*)")]
        rc, out = run(step(0) + step(100) + step(200) + odd, "--skip", "0")
        self.assertEqual(rc, 0, out)
        self.assertIn("3 steps of 3 kernels (of 4 steps", out)

    def test_kernel_inside_another_adds_nothing(self):
        inner = [(0, 10, "q_embed_kernel"), (2, 5, "tiny_kernel"), (10, 12, "tail_kernel")]
        rc, out = run(inner, "--skip", "0")
        self.assertEqual(rc, 0, out)
        rows = {l.split()[0]: l.split() for l in out.splitlines()[3:]}
        self.assertEqual(rows["tiny_kernel"][3], "0.0")
        self.assertEqual(rows["tiny_kernel"][5], "3.00")  # wholly inside the embed
        self.assertIn("step wall 12.0 us, idle gaps 0.0 us", out)

    def test_no_kernels_fails(self):
        rc, out = run([], "--skip", "0")
        self.assertNotEqual(rc, 0)
        self.assertIn("no kernels", out)

    def test_no_step_start_fails(self):
        rc, out = run([(0, 5, "gemm_kernel")], "--skip", "0")
        self.assertNotEqual(rc, 0)
        self.assertIn("no step starts", out)


if __name__ == "__main__":
    unittest.main()
