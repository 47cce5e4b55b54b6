import json
import os
import random
import subprocess
import sys

import pytest

import synth
from conftest import ROOT
from flashbench_reports.cli import main
from flashbench_reports import stats


def _pair(tmp_path, base_recs, cur_recs):
    return (synth.write(tmp_path / "base.json", synth.doc(base_recs)),
            synth.write(tmp_path / "cur.json", synth.doc(cur_recs)))


def test_five_percent_slowdown_at_low_noise_is_a_regression(tmp_path, capsys):
    p = synth.problem(2048)
    base = [synth.record("fa2_q_outer", {"block_m": 128}, p, 100.0, cv=0.003, n=40, rng=random.Random(1)),
            synth.record("fa1_kv_outer", {"block_m": 64}, p, 200.0, cv=0.003, n=40, rng=random.Random(2))]
    cur = [synth.record("fa2_q_outer", {"block_m": 128}, p, 105.0, cv=0.003, n=40, rng=random.Random(3)),
           synth.record("fa1_kv_outer", {"block_m": 64}, p, 200.0, cv=0.003, n=40, rng=random.Random(4))]
    b, c = _pair(tmp_path, base, cur)
    out = tmp_path / "table.md"
    assert main(["compare", b, c, "-o", str(out)]) == 1
    text = out.read_text()
    assert "FAIL" in text
    reg = [l for l in text.splitlines() if l.startswith("| regression")]
    assert len(reg) == 1 and base[0]["name"] in reg[0]
    assert base[1]["name"] not in "".join(reg)
    assert base[0]["name"] in capsys.readouterr().out


def test_a_flagged_point_says_whether_its_kernel_sources_changed(tmp_path):
    p = synth.problem(2048)
    base = [synth.record("fa2_q_outer", {"block_m": 128}, p, 100.0, cv=0.003, n=40, rng=random.Random(1)),
            synth.record("fa1_kv_outer", {"block_m": 64}, p, 200.0, cv=0.003, n=40, rng=random.Random(2))]
    cur = [synth.record("fa2_q_outer", {"block_m": 128}, p, 105.0, cv=0.003, n=40, rng=random.Random(3)),
           synth.record("fa1_kv_outer", {"block_m": 64}, p, 210.0, cv=0.003, n=40, rng=random.Random(4))]
    bd, cd = synth.doc(base), synth.doc(cur)
    bd["context"]["build"] = {"variant_sources": {"fa2_q_outer": "aaaa", "fa1_kv_outer": "cccc"}}
    cd["context"]["build"] = {"variant_sources": {"fa2_q_outer": "bbbb", "fa1_kv_outer": "cccc"}}
    b, c = synth.write(tmp_path / "base.json", bd), synth.write(tmp_path / "cur.json", cd)
    out = tmp_path / "table.md"
    assert main(["compare", b, c, "-o", str(out)]) == 1
    reg = {l.split("`")[1]: l for l in out.read_text().splitlines() if l.startswith("| regression")}
    assert len(reg) == 2
    assert "its kernel sources changed" in reg[base[0]["name"]]
    assert "same kernel sources" in reg[base[1]["name"]]


def test_runs_timed_under_different_loads_are_flagged(tmp_path):
    p = synth.problem(2048)
    recs = [synth.record("fa2_q_outer", {"block_m": 128}, p, 100.0, cv=0.003, n=40, rng=random.Random(1))]
    b = synth.write(tmp_path / "base.json", synth.doc(recs))  # written before timing.queue existed: round_trip
    c = synth.write(tmp_path / "cur.json", synth.doc(recs, queue="back_to_back"))
    same = synth.write(tmp_path / "same.json", synth.doc(recs, queue="round_trip"))
    out = tmp_path / "table.md"
    main(["compare", b, c, "-o", str(out)])
    assert "different loads (timing.queue round_trip vs back_to_back)" in out.read_text()
    main(["compare", b, same, "-o", str(out)])
    assert "different loads" not in out.read_text()


def test_same_distribution_gives_no_false_regression(tmp_path):
    rng = random.Random(12345)
    base, cur = [], []
    for i in range(100):
        p = synth.problem(256 * (1 + i % 10), head_dim=64 if i < 50 else 128, batch=1 + i // 10)
        med = rng.uniform(20, 2000)
        cv = rng.choice([0.003, 0.01, 0.03])
        base.append(synth.record("fa2_q_outer", {"block_m": 64}, p, med, cv=cv, n=30, rng=rng))
        cur.append(synth.record("fa2_q_outer", {"block_m": 64}, p, med, cv=cv, n=30, rng=rng))
    b, c = _pair(tmp_path, base, cur)
    out = tmp_path / "t.md"
    assert main(["compare", b, c, "-o", str(out)]) == 0
    assert "| regression" not in out.read_text()


def test_added_and_removed_points_are_reported_not_failed(tmp_path):
    p1, p2, p3 = synth.problem(512), synth.problem(1024), synth.problem(2048)
    base = [synth.record("fa2_q_outer", {}, p1, 50), synth.record("fa2_q_outer", {}, p2, 90)]
    cur = [synth.record("fa2_q_outer", {}, p1, 50), synth.record("fa2_q_outer", {}, p3, 170)]
    b, c = _pair(tmp_path, base, cur)
    out = tmp_path / "t.md"
    assert main(["compare", b, c, "-o", str(out)]) == 0
    text = out.read_text()
    assert "| added | `{}`".format(cur[1]["name"]) in text
    assert "| removed | `{}`".format(base[1]["name"]) in text
    assert "PASS" in text


def test_ok_to_incorrect_fails_and_ok_to_skipped_does_not(tmp_path):
    p1, p2 = synth.problem(512), synth.problem(1024)
    base = [synth.record("v", {}, p1, 50), synth.record("v", {}, p2, 50)]
    cur = [synth.record("v", {}, p1, status="incorrect", reason="max error 0.3 > tol"),
           synth.record("v", {}, p2, 50)]
    b, c = _pair(tmp_path, base, cur)
    assert main(["compare", b, c]) == 1
    cur = [synth.record("v", {}, p1, status="skipped", reason="needs sm_90"), synth.record("v", {}, p2, 50)]
    b, c = _pair(tmp_path, base, cur)
    assert main(["compare", b, c]) == 0


def test_noisy_large_change_is_not_a_regression_without_significance(tmp_path):
    # 3% apart but 10% noise with few samples: not significant
    p = synth.problem(512)
    base = [synth.record("v", {}, p, 100, cv=0.10, n=8, rng=random.Random(5))]
    cur = [synth.record("v", {}, p, 103, cv=0.10, n=8, rng=random.Random(6))]
    b, c = _pair(tmp_path, base, cur)
    assert main(["compare", b, c]) == 0


def test_gb_style_file_without_samples_uses_threshold_only(tmp_path):
    def rec(t):
        return {"name": "BM_x/1024", "run_type": "iteration", "iterations": 100, "real_time": t, "cpu_time": t,
                "time_unit": "ns"}
    b = synth.write(tmp_path / "b.json", {"context": {}, "benchmarks": [rec(1000.0)]})
    c = synth.write(tmp_path / "c.json", {"context": {}, "benchmarks": [rec(1100.0)]})
    assert main(["compare", b, c]) == 1


@pytest.mark.parametrize("content,needle", [
    ('{"context": {"schema_version": 1}, "benchmarks": [', "malformed JSON"),
    ('{"context": {"schema_version": 2}, "benchmarks": []}', "schema_version 2"),
    ('[1, 2, 3]', "not a results file"),
])
def test_bad_input_exits_2_with_one_line_and_no_output(tmp_path, capsys, content, needle):
    good = synth.write(tmp_path / "good.json", synth.doc([synth.record("v", {}, synth.problem(), 10)]))
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    out = tmp_path / "table.md"
    for args in (["compare", good, str(bad)], ["compare", str(bad), good]):
        assert main(args + ["-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err and "bad.json" in err
        assert not out.exists()


def test_missing_file_exits_2(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "nope.json"), str(tmp_path / "nope2.json")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_python_dash_m_entry_point(tmp_path):
    p = synth.problem()
    b, c = _pair(tmp_path, [synth.record("v", {}, p, 100, rng=random.Random(1))],
                 [synth.record("v", {}, p, 110, rng=random.Random(2))])
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, "-m", "flashbench_reports", "compare", b, c], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "regression" in r.stdout


def test_own_mann_whitney_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = random.Random(7)
    for shift in (0.0, 0.2, 1.0):
        x = [round(rng.gauss(0, 1), 1) for _ in range(60)]
        y = [round(rng.gauss(shift, 1), 1) for _ in range(80)]
        ours = stats._mann_whitney_u_normal(x, y)
        ref = scipy_stats.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic").pvalue
        assert ours == pytest.approx(ref, rel=1e-6, abs=1e-12)


GB_COMPARE = "/usr/share/benchmark/compare.py"


@pytest.mark.skipif(not os.path.exists(GB_COMPARE),
                    reason="Google Benchmark's compare.py not found; apt-get install libbenchmark-tools")
def test_google_benchmark_compare_reads_our_schema(tmp_path):
    pytest.importorskip("scipy", reason="GB compare.py needs scipy")
    b = synth.write(tmp_path / "b.json", synth.doc(synth.sweep(0)))
    c = synth.write(tmp_path / "c.json", synth.doc(synth.sweep(1, speed=0.9)))
    r = subprocess.run([sys.executable, GB_COMPARE, "--no-color", "benchmarks", b, c], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "fa2_q_outer/block_m=128,block_n=64,warp_layout=split_q/b1_hq16_hkv16_sq1024_skv1024_d128_bf16" in r.stdout
