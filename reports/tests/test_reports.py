import os
import random
import re
import sqlite3

import pytest

import synth
from flashbench_reports.cli import main


def _pngs(d):
    figs = os.path.join(d, "figures")
    return sorted(os.path.join(figs, f) for f in os.listdir(figs) if f.endswith(".png"))


def _assert_png(path):
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == b"\x89PNG\r\n\x1a\n" and os.path.getsize(path) > 2000, path


@pytest.fixture(scope="module")
def html_report(tmp_path_factory):
    d = tmp_path_factory.mktemp("html")
    recs = synth.sweep(0)
    peers = [r for r in recs if r["variant"].startswith("peer:")]
    ours = [r for r in recs if not r["variant"].startswith("peer:")]
    a = synth.write(d / "run.json", synth.doc(ours))
    b = synth.write(d / "peers.json", synth.doc(peers, ceilings=None))
    out = d / "report"
    assert main(["html", a, b, "-o", str(out)]) == 0
    return out


def test_html_writes_index_and_every_figure(html_report):
    index = (html_report / "index.html").read_text()
    stems = [os.path.basename(p) for p in _pngs(str(html_report))]
    for stem in ("tflops_vs_seqlen.png", "pct_of_ceiling.png", "roofline.png", "hbm_bytes.png", "occupancy.png",
                 "split_q_vs_split_k.png"):
        assert stem in stems
    assert any(s.startswith("heatmap_fa3_pipelined") for s in stems)
    for p in _pngs(str(html_report)):
        _assert_png(p)
    assert index.count("<img ") == len(stems)
    assert "data:image/png;base64," in index  # self-contained
    for needle in ("peer:torch_flash", "incorrect", "crashed", "skipped", "cudaErrorIllegalAddress",
                   "shared memory 245760 B"):
        assert needle in index
    summary = (html_report / "summary.md").read_text()
    assert "not ok" in summary and "fa3_pipelined" in summary


def test_html_omits_figures_without_data_and_says_why(tmp_path):
    p = synth.problem(1024)
    recs = [synth.record("fa2_q_outer", {"block_m": 64}, p, 100, counters=False)]
    a = synth.write(tmp_path / "r.json", synth.doc(recs, ceilings=None))
    assert main(["html", a, "-o", str(tmp_path / "out")]) == 0
    index = (tmp_path / "out" / "index.html").read_text()
    assert index.count("<img ") == 1  # only HBM bytes: model vs minimum, saying counters are missing
    assert "none in this file: counters were not collected" in index
    assert "no measured ceilings" in index and "two or more sequence lengths" in index
    assert "split_q and split_k" in index and "achieved occupancy" in index


def test_html_tolerates_missing_optional_fields(tmp_path):
    recs = [{"name": "BM_foo/1", "real_time": 10, "time_unit": "ns"}, {"name": "x", "status": "ok"},
            {"name": "fa2_q_outer/block_m=64/b1_hq8_hkv8_sq256_skv256_d64_fp16", "real_time": 3.0, "time_unit": "ms",
             "flops": 1e9, "problem": None, "config": None, "counters": None, "occupancy": None}]
    a = synth.write(tmp_path / "r.json", {"context": {"ceilings": None, "device": None}, "benchmarks": recs})
    assert main(["html", a, "-o", str(tmp_path / "out")]) == 0


def test_bringup_end_to_end(tmp_path):
    a = synth.write(tmp_path / "h100.json", synth.doc(synth.sweep(0)))
    b = synth.write(tmp_path / "h200.json", synth.doc(synth.sweep(1, speed=1.3), device=synth.H200,
                                                       ceilings={"gemm_bf16_tflops": 750.0, "copy_gbps": 4300.0},
                                                       queue="back_to_back"))
    out = tmp_path / "bringup"
    assert main(["bringup", a, b, "-o", str(out)]) == 0
    index = (out / "index.html").read_text()
    assert "NVIDIA H200" in index and "NVIDIA H100 80GB HBM3" in index and "580.65.06" in index
    assert "measured B/A" in index and "1.30×" in index  # the synthetic H200 is 1.3x faster everywhere
    pngs = _pngs(str(out))
    assert {os.path.basename(p) for p in pngs} == {"bringup_abs.png", "bringup_norm.png", "bringup_speedup.png"}
    for p in pngs:
        _assert_png(p)
    assert "| SMs | 132 | 132 |" in (out / "bringup.md").read_text()
    # the load each run was timed under sits with the device facts (a bring-up compares clocks under a power cap)
    assert "| timed load (timing.queue) | round_trip | back_to_back |" in (out / "bringup.md").read_text()


def test_history_end_to_end(tmp_path, capsys):
    db = str(tmp_path / "h.sqlite")
    p = synth.problem(2048)
    name = None
    levels = [100] * 8 + [106] * 6 + [95] * 4  # a 6% regression at run 9, a fix beyond it at run 15
    for night, med in enumerate(levels):
        rng = random.Random(night)
        recs = [synth.record("fa2_q_outer", {"block_m": 128}, p, med * (1 + rng.gauss(0, 0.003)), cv=0.003, n=40,
                             rng=rng),
                synth.record("fa1_kv_outer", {"block_m": 64}, p, 300 * (1 + rng.gauss(0, 0.003)), cv=0.003, n=40,
                             rng=rng)]
        name = recs[0]["name"]
        d = synth.doc(recs, git_sha="sha{:04d}".format(night))
        d["context"]["date"] = "2025-01-{:02d}T03:00:00+00:00".format(night + 1)
        f = synth.write(tmp_path / "n{}.json".format(night), d)
        assert main(["history", "ingest", f, "--db", db]) == 0
    assert main(["history", "ingest", f, "--db", db, "--git-sha", "zzz"]) == 0  # same file again: no new run
    assert "already ingested" in capsys.readouterr().out
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == len(levels)
    assert con.execute("SELECT COUNT(*) FROM points").fetchone()[0] == 2 * len(levels)
    con.close()
    out = tmp_path / "hist"
    assert main(["history", "plot", "--db", db, "-o", str(out)]) == 0
    md = (out / "history.md").read_text()
    assert re.search(r"#9 sha0008 \| regression \| \+[56]\.\d+%", md), md  # a 6% level step, noise aside
    assert re.search(r"#15 sha0014 \| improvement \| -10\.\d+%", md), md
    assert md.count("| regression") + md.count("| improvement") == 2
    assert "fa1_kv_outer" not in md  # flat point: no change
    assert len(_pngs(str(out))) == 2
    out2 = tmp_path / "hist2"
    assert main(["history", "plot", "--db", db, "-o", str(out2), "--point", name]) == 0
    assert len(_pngs(str(out2))) == 1
    assert main(["history", "plot", "--db", db, "-o", str(out2), "--point", "nonexistent"]) == 2


def test_history_says_whether_the_kernel_sources_changed_at_a_step(tmp_path):
    db = str(tmp_path / "h.sqlite")
    p = synth.problem(2048)
    for night in range(12):
        rng = random.Random(night)
        recs = [synth.record("fa2_q_outer", {"block_m": 128}, p, (100 if night < 6 else 105) * (1 + rng.gauss(0, 0.002)),
                             cv=0.003, n=40, rng=rng),
                synth.record("fa1_kv_outer", {"block_m": 64}, p, (300 if night < 6 else 315) * (1 + rng.gauss(0, 0.002)),
                             cv=0.003, n=40, rng=rng)]
        d = synth.doc(recs, git_sha="s{}".format(night))
        d["context"]["date"] = "2025-01-{:02d}T03:00:00+00:00".format(night + 1)
        # fa2_q_outer's kernel changed at run 7, fa1_kv_outer's did not: its step is the harness's or the toolkit's
        d["context"]["build"] = {"variant_sources": {"fa2_q_outer": "aa" if night < 6 else "bb", "fa1_kv_outer": "cc"}}
        assert main(["history", "ingest", synth.write(tmp_path / "n{}.json".format(night), d), "--db", db]) == 0
    out = tmp_path / "hist"
    assert main(["history", "plot", "--db", db, "-o", str(out)]) == 0
    md = (out / "history.md").read_text()
    assert re.search(r"#7 s6 \| regression \| \+[45]\.\d+% \|  \| kernel sources changed here \| `fa2_q_outer", md), md
    assert re.search(r"#7 s6 \| regression \| \+[45]\.\d+% \|  \| same kernel sources \| `fa1_kv_outer", md), md


def test_history_ticks_are_distinct_where_runs_share_a_commit_and_day():
    from flashbench_reports.history import _tick
    runs = [("2025-01-01T03:00:00+00:00", i, "abc1234") for i in range(1, 4)]
    assert len({_tick(r) for r in runs}) == 3


def test_history_marks_a_host_change(tmp_path):
    db = str(tmp_path / "h.sqlite")
    p = synth.problem(2048)
    for night in range(12):
        rng = random.Random(night)
        med = 100 if night < 6 else 104  # the pool moved the nightly to another host at run 7
        d = synth.doc([synth.record("fa2_q_outer", {"block_m": 128}, p, med * (1 + rng.gauss(0, 0.002)), cv=0.003,
                                    n=40, rng=rng)], git_sha="s{}".format(night))
        d["context"]["date"] = "2025-01-{:02d}T03:00:00+00:00".format(night + 1)
        d["context"]["machine"] = {"gpu_uuid": "GPU-a" if night < 6 else "GPU-b", "host_id": "h"}
        assert main(["history", "ingest", synth.write(tmp_path / "n{}.json".format(night), d), "--db", db]) == 0
    out = tmp_path / "hist"
    assert main(["history", "plot", "--db", db, "-o", str(out)]) == 0
    md = (out / "history.md").read_text()
    assert re.search(r"#7 s6 \| regression \| \+[34]\.\d+% \| host changed here", md), md

