#!/usr/bin/env python3
"""Tests of scripts/summary.py (the main job's closing summary) and of sweeps/quick.yaml's coverage.

  python3 tests/scripts/test_summary.py [FLASHBENCH_BIN]

On synthetic results files (reports/tests/synth.py): the best rate per variant and shape, the bound chosen by
arithmetic intensity against the measured ridge, the percentages of the ceilings, e4m3 without an e4m3 ceiling,
failures and skips, a file without ceilings, and an unreadable file. With FLASHBENCH_BIN: sweeps/quick.yaml run by the
fake worker gives ok points for every variant of the catalog, and the summary has a column for each.
Standard library only.
"""
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SUMMARY = os.path.join(ROOT, "scripts", "summary.py")
sys.path.insert(0, os.path.join(ROOT, "reports", "tests"))
import synth  # noqa: E402

spec = importlib.util.spec_from_file_location("summary", SUMMARY)
summary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(summary)
FLASHBENCH = None


def render(doc):
    out = io.StringIO()
    summary.summarize(doc, out)
    return out.getvalue()


def row(text, shape):
    """The table row of a shape: (bound, {variant: cell})."""
    lines = text.splitlines()
    header = next(i for i, l in enumerate(lines) if l.startswith("shape"))
    variants = lines[header].split()[2:]
    for line in lines[header + 1:]:
        if line.startswith(shape + " "):
            rest = line[len(shape):].split()
            bound, cells = rest[0], rest[1:]
            # A cell is "value pct" or one word (skip, FAIL, -, or a value without a ceiling).
            out, i = {}, 0
            for v in variants:
                if i + 1 < len(cells) and "%" in cells[i + 1]:
                    out[v] = cells[i] + " " + cells[i + 1]
                    i += 2
                else:
                    out[v] = cells[i]
                    i += 1
            return bound, out
    raise AssertionError("no row for {} in:\n{}".format(shape, text))


def e4m3_record(prob_seqlen, median_us):
    r = synth.record("fa3_fp8", {"stages": 3}, synth.problem(prob_seqlen), median_us)
    r["problem"]["dtype"] = "e4m3"
    r["name"] = r["name"].replace("_bf16", "_e4m3")
    return r


class Synthetic(unittest.TestCase):
    def setUp(self):
        self.recs = synth.sweep(0)
        self.decode = synth.problem(32768, seqlen_q=1, heads_q=32, heads_kv=8)
        self.recs.append(synth.record("flash_decoding", {"block_n": 64}, self.decode, 60.0))
        self.recs.append(synth.record("flash_decoding", {"block_n": 128}, self.decode, 50.0))
        self.recs.append(synth.record("fa2_q_outer", {"block_m": 64}, self.decode, 900.0))
        self.recs.append(e4m3_record(4096, 300.0))
        self.doc = synth.doc(self.recs)

    def best(self, variant, prob, rate):
        return max(rate(r) for r in self.recs if r["variant"] == variant and r["problem"] == prob
                   and r["status"] == "ok")

    def test_compute_bound_best_tflops_and_share_of_gemm(self):
        text = render(self.doc)
        self.assertIn("ceilings measured: bf16 GEMM 700 TFLOP/s, copy 3000 GB/s; ridge 233 FLOP/B", text)
        p = synth.problem(4096)
        bound, cells = row(text, "b1 h16/16 q4096 kv4096 d128 bf16")
        self.assertEqual(bound, "T")
        # fa2_q_outer has two configs here (split_q, split_k): the faster one is shown.
        best = self.best("fa2_q_outer", p, lambda r: r["tflops"])
        self.assertEqual(cells["fa2_q_outer"], "{:.0f} {:.0f}%".format(best, 100 * best / 700.0))
        # fa3_pipelined: the tile sweep on this shape (a skipped config among them) still has a best.
        best = self.best("fa3_pipelined", p, lambda r: r["tflops"])
        self.assertEqual(cells["fa3_pipelined"], "{:.0f} {:.0f}%".format(best, 100 * best / 700.0))
        self.assertEqual(cells["flash_decoding"], "-")

    def test_memory_bound_decode_in_gbps_of_the_copy(self):
        text = render(self.doc)
        bound, cells = row(text, "b1 h32/8 q1 kv32768 d128 bf16")
        self.assertEqual(bound, "G")
        gbps = synth.bytes_min(self.decode) / (min(r["median_us"] for r in self.recs
                                                    if r["variant"] == "flash_decoding") * 1e-6) / 1e9
        self.assertEqual(cells["flash_decoding"], "{:.0f} {:.0f}%".format(gbps, 100 * gbps / 3000.0))
        self.assertTrue(cells["fa2_q_outer"].endswith("%"))

    def test_e4m3_has_no_share_without_an_e4m3_ceiling(self):
        text = render(self.doc)
        _, cells = row(text, "b1 h16/16 q4096 kv4096 d128 e4m3")
        self.assertNotIn("%", cells["fa3_fp8"])
        self.assertIn("e4m3 rows: no %", text)
        self.doc["context"]["ceilings"]["gemm_e4m3_tflops"] = 1400.0
        _, cells = row(render(self.doc), "b1 h16/16 q4096 kv4096 d128 e4m3")
        tf = self.recs[-1]["tflops"]
        self.assertEqual(cells["fa3_fp8"], "{:.0f} {:.0f}%".format(tf, 100 * tf / 1400.0))

    def test_a_backward_point_has_its_own_row(self):
        p = synth.problem(4096)
        b = dict(p, **{"pass": "bwd"})
        r = synth.record("fa2_bwd", {"block_m": 64}, b, 900.0)
        r["name"] = r["name"] + "_bwd"
        self.recs.append(r)
        text = render(synth.doc(self.recs))
        _, fwd = row(text, "b1 h16/16 q4096 kv4096 d128 bf16")
        _, bwd = row(text, "b1 h16/16 q4096 kv4096 d128 bf16 bwd")
        self.assertEqual(fwd["fa2_bwd"], "-")
        self.assertEqual(bwd["fa2_q_outer"], "-")
        self.assertRegex(bwd["fa2_bwd"], r"^\d+ \d+%$")

    def test_failures_listed_and_skips_counted(self):
        text = render(self.doc)
        _, cells = row(text, "b1 h16/16 q2048 kv2048 d128 fp32")
        self.assertEqual(cells["fa1_kv_outer"], "FAIL")
        self.assertEqual(cells["peer:torch_flash"], "skip")
        self.assertIn("1 crashed, 1 incorrect", text)
        self.assertIn("  crashed: fa2_q_outer/block_m=64,block_n=64/b1_hq16_hkv16_sq2048_skv2048_d128_fp32: "
                      "cudaErrorIllegalAddress", text)
        self.assertRegex(text, r"skipped\s+1 fa3_pipelined: shared memory 245760 B exceeds")

    def test_a_failed_config_marks_the_best_of_the_others(self):
        p = synth.problem(4096)
        self.recs.append(synth.record("fa2_q_outer", {"block_m": 32}, p, status="crashed", reason="boom"))
        _, cells = row(render(synth.doc(self.recs)), "b1 h16/16 q4096 kv4096 d128 bf16")
        self.assertTrue(cells["fa2_q_outer"].endswith("%!"), cells["fa2_q_outer"])

    def test_without_ceilings_no_percentages(self):
        text = render(synth.doc(self.recs, ceilings=None))
        self.assertIn("no ceilings in this file", text)
        bound, cells = row(text, "b1 h32/8 q1 kv32768 d128 bf16")
        self.assertEqual(bound, "T")
        self.assertFalse(any("%" in c for c in cells.values()), cells)

    def test_cli_and_unreadable_file(self):
        with tempfile.TemporaryDirectory() as d:
            good = synth.write(os.path.join(d, "r.json"), self.doc)
            r = subprocess.run([sys.executable, SUMMARY, good], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("summary of {} points on NVIDIA H100 80GB HBM3".format(len(self.recs)), r.stdout)
            for bad, why in ((os.path.join(d, "missing.json"), "cannot read"), (d, "cannot read")):
                r = subprocess.run([sys.executable, SUMMARY, bad], capture_output=True, text=True)
                self.assertEqual(r.returncode, 2)
                self.assertEqual(r.stdout, "")
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn(why, r.stderr)
            with open(os.path.join(d, "x.json"), "w") as f:
                json.dump({"context": {}}, f)
            r = subprocess.run([sys.executable, SUMMARY, os.path.join(d, "x.json")], capture_output=True, text=True)
            self.assertEqual(r.returncode, 2)
            self.assertIn("no 'benchmarks' list", r.stderr)


class QuickSweep(unittest.TestCase):
    """sweeps/quick.yaml exercises the whole catalog: every variant has points that run (by the fake worker, on no
    particular GPU, so the Hopper-only ones run too)."""

    def test_every_variant_runs(self):
        if not FLASHBENCH:
            self.skipTest("no flashbench binary given")
        env = dict(os.environ)
        env.pop("FLASHBENCH_TEST_VARIANTS", None)  # the catalog users see
        listing = subprocess.run([FLASHBENCH, "list", "--json"], capture_output=True, text=True, check=True, env=env)
        catalog = {v["name"] for v in json.loads(listing.stdout)}
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "quick.json")
            r = subprocess.run([FLASHBENCH, "run", os.path.join(ROOT, "sweeps", "quick.yaml"), "--fake-worker",
                                "--fake-delay-ms", "1", "--no-ceilings", "-o", out], capture_output=True, text=True,
                               env=env, cwd=d)
            self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
            with open(out) as f:
                doc = json.load(f)
        ok = {x["variant"] for x in doc["benchmarks"] if x["status"] == "ok"}
        self.assertGreater(len(catalog), 5)
        self.assertEqual(sorted(catalog - ok), [], "variants of `flashbench list` without an ok point in quick.yaml")
        header = next(l for l in render(doc).splitlines() if l.startswith("shape")).split()[2:]
        self.assertEqual(sorted(header), sorted(catalog))


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        FLASHBENCH = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=1)
