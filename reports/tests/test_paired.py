"""The paired gate's statistics and its CPU-side plumbing (no GPU): verdicts on synthetic interleaved samples, the
re-measure loop, the dry-run parser and the acceptance table."""
import json
import math
import random

import pytest

from flashbench_reports import gate, paired, stats


def _pairs(n, factor, rng, shared=0.01, own=0.003, base=100.0):
    ref, cand = [], []
    for _ in range(n):
        g = rng.gauss(0, shared)  # what both sides of a pair share: clock, temperature
        ref.append(base * (1 + g + rng.gauss(0, own)))
        cand.append(base * factor * (1 + g + rng.gauss(0, own)))
    return ref, cand


def test_same_build_is_never_a_regression():
    rng = random.Random(1)
    for _ in range(200):
        v = paired.decide(*_pairs(60, 1.0, rng))
        assert v.verdict in ("unchanged", "unknown"), v


def test_three_percent_slower_is_flagged_and_one_percent_is_not():
    rng = random.Random(2)
    for _ in range(50):
        assert paired.decide(*_pairs(60, 1.03, rng)).verdict == "regression"
        assert paired.decide(*_pairs(60, 1.01, rng)).verdict == "unchanged"
        assert paired.decide(*_pairs(60, 0.96, rng)).verdict == "improvement"


def test_a_noisy_point_is_unknown_never_a_regression():
    rng = random.Random(3)
    ref, cand = _pairs(12, 1.05, rng, shared=0.0, own=0.08)  # a real 5% change, drowned in 8% pair noise
    v = paired.decide(ref, cand)
    assert v.verdict == "unknown" and "noisy" in v.why
    assert paired.needs_more(v)
    assert paired.decide(ref[:5], cand[:5]).verdict == "unknown"  # too few pairs


def test_remeasure_until_decided(monkeypatch):
    """time_point gives an unknown point more attempts, each with its order swapped, and pools the pairs."""
    rng = random.Random(4)
    calls = []

    class FakeTimer:
        def __init__(self, n):
            self.n = n

        def measure_many(self, fns):
            calls.append((self.n, fns))
            ref, cand = _pairs(self.n, 1.03, rng, shared=0.0, own=0.02)
            first, second = (ref, cand) if fns[0] == "ref" else (cand, ref)
            return [{"samples_us": first}, {"samples_us": second}]

    v, r, c, n = gate.time_point(None, lambda k: FakeTimer(10 * 4 ** k), "ref", "cand", 3, 0.02, 0.05, 7.0, 0.005)
    assert n >= 2 and [f[0] for _, f in calls] == ["ref", "cand", "ref"][:n]  # order swapped each attempt
    assert len(r) == len(c) == sum(10 * 4 ** k for k in range(n))
    assert v.verdict == "regression"


def test_own_wilcoxon_and_ks_match_scipy():
    ss = pytest.importorskip("scipy.stats")
    rng = random.Random(7)
    for shift in (0.0, 0.2, 1.0):
        x = [round(rng.gauss(0, 1), 1) for _ in range(80)]
        y = [round(rng.gauss(shift, 1), 1) for _ in range(60)]
        d = [a - b + shift for a, b in zip(x, y)]
        ref = ss.wilcoxon(d, zero_method="wilcox", correction=True, method="approx").pvalue
        assert stats.wilcoxon_signed_rank(d) == pytest.approx(ref, rel=1e-6, abs=1e-12)
        # asymptotic KS: the same distribution, to within the small-sample corrections scipy applies
        assert stats.ks_2samp(x, y) == pytest.approx(ss.ks_2samp(x, y, method="asymp").pvalue, abs=0.05)


def test_change_points_find_steps_not_noise():
    rng = random.Random(5)
    flat = [math.log(100 * (1 + rng.gauss(0, 0.01))) for _ in range(80)]
    assert stats.change_points(flat) == []
    step = [math.log(100 * (1 + rng.gauss(0, 0.004))) for _ in range(30)] + \
           [math.log(103 * (1 + rng.gauss(0, 0.004))) for _ in range(30)]
    assert stats.change_points(step) == [30]
    small = [math.log(100 * (1 + rng.gauss(0, 0.001))) for _ in range(30)] + \
            [math.log(101 * (1 + rng.gauss(0, 0.001))) for _ in range(30)]
    assert stats.change_points(small) == []  # significant but under the 2% floor


def test_parse_dry_run():
    text = ("plan for nightly (sweeps/nightly.yaml) on NVIDIA H100\n  2 problems, 3 points\npoints:\n"
            "  run  fa2_q_outer/block_m=128,block_n=64/b1_hq16_hkv16_sq1024_skv1024_d128_bf16  1.1 GFLOP, min 1 MB\n"
            "  skip fa3_fp8/stages=3/b1_hq16_hkv16_sq1024_skv1024_d128_bf16  1.1 GFLOP  (needs e4m3)\n"
            "  run  naive/softmax_threads=256/b1_hq16_hkv16_sq1024_skv1024_d128_causal_bf16  1 GFLOP\n")
    got = gate.parse_dry_run(text)
    assert got[0] == ("run", "fa2_q_outer", "block_m=128,block_n=64", "b1_hq16_hkv16_sq1024_skv1024_d128_bf16")
    assert [g[0] for g in got] == ["run", "skip", "run"]


@pytest.mark.parametrize("bad", ["fa2_q_outer", "fa2_q_outer:", ":0.03", "fa2_q_outer:1.5", "fa2_q_outer:x"])
def test_slowdown_needs_a_fraction(bad):
    with pytest.raises(gate.UserError):
        gate.parse_slowdown(bad)


def test_host_id_prefers_machine_id(tmp_path):
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("boot\n")
    assert gate.read_host_id(str(tmp_path)) == ("boot", "boot-id")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/machine-id").write_text("mid\n")
    assert gate.read_host_id(str(tmp_path)) == ("mid", "machine-id")


def _paired_doc(verdicts, slow=None, uuid="GPU-1"):
    recs = [{"name": "{}/c/p{}".format(v, i), "variant": v, "paired": {"verdict": verdict}}
            for i, (v, verdict) in enumerate(verdicts)]
    return {"context": {"machine": {"gpu_uuid": uuid, "host_id": "h"},
                        "paired_gate": {"wall_s": 60, "test_slowdown": slow}}, "benchmarks": recs}


def test_sources_verdict_compares_the_two_builds_hashes():
    ref, cand = {"a": "1111", "b": "2222"}, {"a": "1111", "b": "3333"}
    assert gate.sources_verdict("a", ref, cand) == "same"
    assert gate.sources_verdict("b", ref, cand) == "changed"
    assert gate.sources_verdict("c", ref, cand) == "unknown"  # a variant one build does not have
    assert gate.sources_verdict("a", None, cand) == "unknown"  # a build whose hashes could not be read
    assert gate.sources_verdict("a", {"a": ""}, cand) == "unknown"


def test_summary_says_whether_a_flagged_variants_sources_changed():
    doc = _paired_doc([("fa3_bwd", "regression"), ("naive", "regression"), ("fa2_bwd", "regression"),
                       ("fa3_fp8", "unknown")])
    for r, src in zip(doc["benchmarks"], ("changed", "same", "unknown", "same")):
        r["paired"]["sources"] = src
    lines = gate.render_summary(doc).splitlines()
    assert lines[0].startswith("paired gate: FAIL")
    assert lines[1].endswith("fa3_bwd/c/p0 (its kernel sources changed)")
    assert "naive/c/p1 (same kernel sources: look at the harness" in lines[2]
    assert lines[3].endswith("fa2_bwd/c/p2")  # unknown sources: nothing said
    assert lines[4].endswith("fa3_fp8/c/p3")  # an unknown verdict flags nothing, so no note


def test_variant_sources_reads_each_builds_list(tmp_path):
    fake = tmp_path / "flashbench"
    fake.write_text("#!/bin/sh\necho '[{\"name\": \"naive\", \"source_hash\": \"00ff\"}]'\n")
    fake.chmod(0o755)
    assert gate.variant_sources(str(tmp_path)) == {"naive": "00ff"}
    fake.write_text("#!/bin/sh\necho '[{\"name\": \"naive\"}]'\n")  # a build from before the hashes
    assert gate.variant_sources(str(tmp_path)) is None
    assert gate.variant_sources(str(tmp_path / "none")) is None


def test_acceptance_table_counts_false_regressions_and_misses(tmp_path):
    same = tmp_path / "same.json"
    same.write_text(json.dumps(_paired_doc([("naive", "unchanged"), ("fa2_q_outer", "unchanged")])))
    slow = tmp_path / "slow.json"
    slow.write_text(json.dumps(_paired_doc([("naive", "unchanged"), ("fa2_q_outer", "regression"),
                                            ("fa2_q_outer", "regression")], {"variant": "fa2_q_outer",
                                                                            "fraction": 0.03})))
    text, bad = gate.acceptance_table([str(same), str(slow)])
    assert bad == 0 and "| slow.json | GPU-1 / h | fa2_q_outer:0.03 | 3 | 2 | 0 | 0 | 0 | 60 |" in text
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps(_paired_doc([("naive", "regression"), ("fa2_q_outer", "unknown")],
                                            {"variant": "fa2_q_outer", "fraction": 0.03})))
    text, bad = gate.acceptance_table([str(wrong)])
    assert bad == 2  # one false regression, one miss
    assert gate.main(["table", str(same), str(slow)]) == 0
    assert gate.main(["table", str(wrong)]) == 1


def test_synthetic_history_example_finds_its_step(tmp_path):
    """reports/examples/make_history_example.py --synthetic: the 4% step at night 20 (run #20) is found there."""
    import subprocess
    import sys
    from conftest import ROOT
    script = __import__("os").path.join(ROOT, "examples", "make_history_example.py")
    r = subprocess.run([sys.executable, script, "--synthetic", "-o", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "history.md").read_text()
    assert "| #20 syn0019 | regression | +3." in md and md.count("| regression") == 1
    assert "SYNTHETIC" in (tmp_path / "README.md").read_text()
