#!/usr/bin/env python3
"""Tests of scripts/model_check.py and `flashbench model` on the committed counter baselines.

  python3 tests/scripts/test_model_check.py FLASHBENCH_BIN

The committed results (reports/baselines/nvidia-h100/quick-counters.json, nvidia-h200/bringup-counters.json: real
CUPTI DRAM bytes) must pass against this build's traffic models; the same files with one point's measured bytes
moved out of what its model allows must fail, so that a model drifting from its kernel fails CI. Standard library
only.
"""
import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK = os.path.join(ROOT, "scripts", "model_check.py")
BASELINES = [os.path.join(ROOT, "reports", "baselines", "nvidia-h100", "quick-counters.json"),
             os.path.join(ROOT, "reports", "baselines", "nvidia-h200", "bringup-counters.json")]
FLASHBENCH = None


def check(path, *args):
    return subprocess.run([sys.executable, CHECK, path, "--flashbench", FLASHBENCH] + list(args),
                          capture_output=True, text=True)


def models(path):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "m.json")
        r = subprocess.run([FLASHBENCH, "model", path, "-o", out], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        with open(out) as f:
            return json.load(f)


class Committed(unittest.TestCase):
    def setUp(self):
        if not FLASHBENCH:
            self.skipTest("no flashbench binary given")

    def test_committed_results_are_within_the_models(self):
        for path in BASELINES:
            r = check(path)
            self.assertEqual(r.returncode, 0, path + "\n" + r.stdout[-4000:] + r.stderr)
            self.assertIn("0 outside", r.stdout.splitlines()[-1])

    def test_the_models_come_from_this_build_not_from_the_file(self):
        with open(BASELINES[0]) as f:
            doc = json.load(f)
        for b in doc["benchmarks"]:
            b["bytes_model"] = 1.0  # stale or wrong: must not matter
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r.json")
            with open(path, "w") as f:
                json.dump(doc, f)
            self.assertEqual(check(path).returncode, 0)

    def test_a_point_the_model_does_not_cover_fails(self):
        with open(BASELINES[0]) as f:
            doc = json.load(f)
        m = models(BASELINES[0])["points"]
        # One point the model commits to (no range), one with a range: push each outside what the model allows.
        plain = next(i for i, p in enumerate(m) if p.get("bytes_model") and "bytes_model_range" not in p)
        ranged = next(i for i, p in enumerate(m) if "bytes_model_range" in p)
        for i, factor in ((plain, 1.3), (plain, 0.7), (ranged, None)):
            bad = copy.deepcopy(doc)
            c = bad["benchmarks"][i]["counters"]
            c["dram_bytes"] = (m[i]["bytes_model_range"][1] * 1.5 if factor is None
                               else m[i]["bytes_model"] * factor)
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "r.json")
                with open(path, "w") as f:
                    json.dump(bad, f)
                r = check(path)
                self.assertEqual(r.returncode, 1, r.stdout[-2000:])
                self.assertIn("1 outside", r.stdout.splitlines()[-1])
                self.assertIn(bad["benchmarks"][i]["name"][:90], r.stdout)

    def test_every_ranged_point_says_why(self):
        for path in BASELINES:
            for p in models(path)["points"]:
                self.assertTrue(p.get("bytes_model_reason"), p["name"])
                if "bytes_model_range" in p:
                    lo, hi = p["bytes_model_range"]
                    self.assertLessEqual(lo, p["bytes_model"])
                    self.assertLessEqual(p["bytes_model"], hi)

    def test_bad_input_is_one_line_and_exit_2(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r.json")
            with open(BASELINES[0]) as f:
                doc = json.load(f)
            del doc["context"]["device"]["l2_bytes"]
            with open(path, "w") as f:
                json.dump(doc, f)
            r = check(path)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("l2_bytes", r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            doc["context"]["device"]["l2_bytes"] = 52428800
            doc["context"]["timing_policy"]["flush"] = "write"  # dirty L2 at the start: not what the models count
            with open(path, "w") as f:
                json.dump(doc, f)
            r = check(path)
            self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
            self.assertIn("flush=write", r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            r = check(os.path.join(d, "missing.json"))
            self.assertEqual(r.returncode, 2)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    if len(sys.argv) > 1 and not sys.argv[1].startswith("-"):
        FLASHBENCH = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=1)
