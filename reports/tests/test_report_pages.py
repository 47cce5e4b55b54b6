"""html grouped by GPU, the bring-up's bound explanation, the traffic section, figure layout, and the pages rendered
in headless Chromium (screenshots kept with --screenshot-dir DIR)."""
import json
import os
import random
import re

import pytest

import synth
from flashbench_reports import bounds as B
from flashbench_reports import figures as F
from flashbench_reports import page
from flashbench_reports import report
from flashbench_reports import results as R
from flashbench_reports import traffic as T
from flashbench_reports.cli import main

H100_CEIL = {"gemm_bf16_tflops": 692.0, "copy_gbps": 3034.0}
H200_CEIL = {"gemm_bf16_tflops": 672.0, "copy_gbps": 4281.0}


@pytest.fixture(autouse=True)
def check_layout(monkeypatch):
    """Every figure drawn in these tests is refused if its text overlaps or a legend covers a panel."""
    monkeypatch.setattr(F, "CHECK_LAYOUT", True)


def _doc(recs, device, ceilings, host="testhost", bus=None):
    d = synth.doc(recs, device=dict(device, **({"pci_bus_id": bus} if bus else {})), ceilings=ceilings)
    d["context"]["host_name"] = host
    return d


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("two")
    h100 = synth.bringup(692, 3034, seed=0)
    h200 = synth.bringup(672, 4281, seed=1, slow={"naive": 0.7})
    a = synth.write(d / "h100.json", _doc(h100, synth.H100, H100_CEIL))
    b = synth.write(d / "h200.json", _doc(h200, synth.H200, H200_CEIL))
    peers = [synth.record("peer:torch_flash", {}, p, synth.time_for(p, 450), rng=random.Random(2))
             for p in synth.BRINGUP_PREFILL]
    c = synth.write(d / "h100-peers.json", _doc(peers, synth.H100, None, bus="00000000:18:00.0"))
    return d, a, b, c


def _sections(index):
    """index.html split at its per-device <h2 id=...> headings: {heading text: section html}."""
    parts = re.split(r"<h2 id='[^']+'>", index)
    return {p.split("</h2>")[0]: p for p in parts[1:]}


def test_html_two_devices_one_section_each_with_own_ceilings(two_gpus):
    d, a, b, c = two_gpus
    out = d / "html"
    assert main(["html", a, c, b, "-o", str(out)]) == 0
    index = (out / "index.html").read_text()
    secs = _sections(index)
    assert list(secs) == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    h100, h200 = secs["NVIDIA H100 80GB HBM3"], secs["NVIDIA H200"]
    assert "692.0" in h100 and "3034.0" in h100 and "672.0" not in h100
    assert "672.0" in h200 and "4281.0" in h200 and "692.0" not in h200
    # the peers file (same GPU: host and bus id agree once NVML's 8-digit domain is read) joins the H100 section
    assert "peer:torch_flash" in h100 and "peer:torch_flash" not in h200
    # each GPU's rows carry its own times: a decode point is 1.41x faster on the H200 (copy ratio)
    name = next(r["name"] for r in synth.bringup(692, 3034) if r["variant"] == "flash_decoding")
    ta = R.load(a).by_name()[name].median_us
    tb = R.load(b).by_name()[name].median_us
    assert "{:.2f}".format(ta) in h100 and "{:.2f}".format(ta) not in h200
    assert "{:.2f}".format(tb) in h200 and "{:.2f}".format(tb) not in h100
    # each section has its own roofline and ridge
    assert "ridge 228 FLOP/B" in h100 and "ridge 157 FLOP/B" in h200
    figs = sorted(os.listdir(out / "figures"))
    assert any(f.startswith("dev1-") and f.endswith("roofline.png") for f in figs)
    assert any(f.startswith("dev2-") and f.endswith("roofline.png") for f in figs)
    md = (out / "summary.md").read_text()
    assert "## NVIDIA H100 80GB HBM3" in md and "## NVIDIA H200" in md


def test_html_refuses_a_file_without_device_and_writes_nothing(two_gpus, tmp_path, capsys):
    d, a, b, c = two_gpus
    doc = json.load(open(b))
    doc["benchmarks"] = doc["benchmarks"][:3]
    doc["context"]["device"] = None
    bad = synth.write(tmp_path / "nodevice.json", doc)
    out = tmp_path / "out"
    assert main(["html", a, bad, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nodevice.json" in err[0] and "no device in context" in err[0]
    assert not out.exists()
    assert main(["html", bad, "-o", str(out)]) == 0  # alone it is one report, whatever GPU it was


def test_html_refuses_when_it_cannot_tell_same_gpu(two_gpus, tmp_path, capsys):
    d, a, b, c = two_gpus
    doc = json.load(open(a))
    doc["context"]["host_name"] = None
    nohost = synth.write(tmp_path / "nohost.json", doc)
    out = tmp_path / "out"
    assert main(["html", a, nohost, "-o", str(out)]) == 2
    assert "cannot tell whether both ran on the same GPU" in capsys.readouterr().err
    assert not out.exists()


def test_html_same_model_on_two_hosts_is_two_sections(tmp_path):
    recs = [r for r in synth.bringup(692, 3034) if r["variant"] == "flash_decoding"]
    a = synth.write(tmp_path / "a.json", _doc(recs, synth.H100, H100_CEIL, host="node1"))
    b = synth.write(tmp_path / "b.json", _doc(recs, synth.H100, dict(H100_CEIL, copy_gbps=2900.0), host="node2"))
    assert main(["html", a, b, "-o", str(tmp_path / "out")]) == 0
    secs = _sections((tmp_path / "out" / "index.html").read_text())
    assert list(secs) == ["NVIDIA H100 80GB HBM3 on node1", "NVIDIA H100 80GB HBM3 on node2"]
    assert "2900.0" in secs["NVIDIA H100 80GB HBM3 on node2"] and "2900.0" not in secs["NVIDIA H100 80GB HBM3 on node1"]


def test_group_by_device_reads_both_bus_id_spellings():
    ctx = lambda bus: R.Results("x", {"device": dict(synth.H100, pci_bus_id=bus), "host_name": "h"}, [])
    assert len(report.group_by_device([ctx("0000:18:00.0"), ctx("00000000:18:00.0")])) == 1
    assert len(report.group_by_device([ctx("0000:18:00.0"), ctx("0000:19:00.0")])) == 2


def test_best_table_sorts_numerically_and_wraps_configs(tmp_path):
    recs = []
    for b in (32, 2, 16, 4):
        p = synth.problem(16384 // b, batch=b)
        recs.append(synth.record("fa2_q_outer", {"block_m": 128, "block_n": 64, "warps": 4, "stages": 2,
                                                 "warp_layout": "split_q"}, p, synth.time_for(p, 300)))
    f = synth.write(tmp_path / "r.json", synth.doc(recs))
    assert main(["html", f, "-o", str(tmp_path / "out")]) == 0
    index = (tmp_path / "out" / "index.html").read_text()
    best = index.split("Best variant per problem")[1]
    order = [int(m) for m in re.findall(r"<td class=\"wrap\" title=\"b(\d+)_", best)]
    assert order[:4] == [2, 4, 16, 32]
    assert '<td class="wrap" title="block_m=128,block_n=64,warps=4,stages=2,warp_layout=split_q">' in best
    assert "td.wrap{max-width" in index
    assert F.natural_key("b2_x") < F.natural_key("b16_x") < F.natural_key("b32_x")


def test_traffic_section_explains_bytes_below_min_and_models_off(two_gpus, tmp_path):
    d, a, b, c = two_gpus
    res = R.load(a)
    below = [p for p in res.points if p.measured_dram_bytes() < p.num("bytes_min")]
    off = [p for p in res.points if abs(p.measured_dram_bytes() / p.num("bytes_model") - 1) > 0.15]
    assert below and off  # the synthetic run has both
    html, md = report.traffic_section(res.points)
    assert html.count("of output write-back still in L2 at kernel end") == len(below)
    assert "{} of them moved fewer bytes than bytes_min".format(len(below)) in html
    assert "{} of {} modelled points are more than 15% off".format(len(off), len(res.points)) in html
    assert "no-reuse bound: K/V re-read per Q tile" in html  # the record's bytes_model_reason
    assert "no reason recorded" in html                      # fa2's records give none
    for p in below:
        assert p.name in html
    assert any("write-back still in L2" in line for line in md)
    # within tolerance and no counters: said so, nothing listed
    p = synth.problem(1024)
    ok = [synth.record("fa2_q_outer", {}, p, 100, counters=True, bytes_model=synth.bytes_min(p) * 1.2,
                       dram=(synth.bytes_min(p), 0.2 * synth.bytes_min(p)))]
    html, _ = report.traffic_section([R.point_from_record(r) for r in ok])
    assert "All 1 modelled points are within 15%" in html and "No point moved fewer bytes" in html
    html, _ = report.traffic_section([R.point_from_record(synth.record("naive", {}, p, 100))])
    assert "counters were not collected" in html


def test_traffic_verdict_counts_a_reason_only_where_its_range_covers_the_measurement():
    assert T.verdict(110, 100) == T.WITHIN and T.verdict(86, 100) == T.WITHIN
    assert T.verdict(120, 100) == T.OUTSIDE and T.verdict(80, 100) == T.OUTSIDE
    assert T.verdict(300, 100, [90, 400]) == T.EXPLAINED
    assert T.verdict(500, 100, [90, 400]) == T.OUTSIDE   # beyond the range's top (+15%)
    assert T.verdict(70, 100, [90, 400]) == T.OUTSIDE    # below its bottom (-15%)
    assert T.verdict(300, 100, "bad") == T.OUTSIDE and T.verdict(300, 100, [400, 90]) == T.OUTSIDE


def test_traffic_section_marks_which_reasons_cover_their_point():
    p = synth.problem(1024)
    mn = synth.bytes_min(p)
    rng = {"bytes_model_reason": "the per-step set is 2.00x the usable L2", "bytes_model_range": [mn, 10 * mn]}
    covered = synth.record("fa1_kv_outer", {"block_m": 64}, p, 100, counters=True, bytes_model=2 * mn,
                           dram=(4 * mn, mn), extra=rng)
    beyond = synth.record("fa1_kv_outer", {"block_m": 32}, p, 100, counters=True, bytes_model=2 * mn,
                          dram=(15 * mn, mn), extra=rng)
    html, md = report.traffic_section([R.point_from_record(r) for r in (covered, beyond)])
    assert "2 of 2 modelled points are more than 15% off" in html
    assert any("1 of them lie in the range their model's reason gives" in line for line in md)
    assert html.count(">explained<") == 1 and html.count(">not explained<") == 1
    assert any("| explained |" in line for line in md) and any("| not explained |" in line for line in md)


def test_bounds_classify_by_intensity_against_each_ridge():
    a = R.Results("a", {"ceilings": H100_CEIL}, [])
    b = R.Results("b", {"ceilings": H200_CEIL}, [])
    ra, rb = B.roof(a), B.roof(b)
    assert round(ra.ridge) == 228 and round(rb.ridge) == 157
    pt = lambda prob: R.point_from_record(synth.record("fa2_q_outer", {}, prob, 100))
    decode = pt(synth.problem(32768, seqlen_q=1, heads_q=32, heads_kv=8))
    prefill = pt(synth.problem(4096, batch=4))
    mid = pt(synth.problem(384, batch=32))  # about 191 FLOP/B: between the two ridges
    for p, kind in ((decode, "memory"), (prefill, "compute"), (mid, "between")):
        assert B.bound_kind(B.intensity(p), [ra.ridge, rb.ridge]) == kind, p.name
    f, n = mid.flops(), mid.num("bytes_min")
    ratio = ra.time_us(f, n) / rb.time_us(f, n)
    assert 672 / 692 < ratio < 4281 / 3034
    # e4m3 uses the e4m3 GEMM where the file has one
    c = R.Results("c", {"ceilings": dict(H100_CEIL, gemm_e4m3_tflops=1300.0)}, [])
    assert B.roof(c, "e4m3").tflops == 1300.0 and B.roof(c, "bf16").tflops == 692.0
    assert B.roof(R.Results("d", {"ceilings": {"gemm_bf16_tflops": 1.0}}, [])) is None


def test_bringup_explains_speedups_by_bound_and_flags_slow_points(two_gpus):
    d, a, b, c = two_gpus
    out = d / "bringup"
    assert main(["bringup", a, b, "-o", str(out)]) == 0
    index = (out / "index.html").read_text()
    md = (out / "bringup.md").read_text()
    assert "A 692 TFLOP/s / 3034 GB/s = 228 FLOP/B, B 672 TFLOP/s / 4281 GB/s = 157 FLOP/B" in index
    assert "B should be 0.97× A (the GEMM ratio)" in index and "B should be 1.41× A (the copy ratio)" in index
    rows = {}
    for line in md.splitlines():
        m = re.match(r"\| `([^`]+)` \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    names = [r["name"] for r in synth.bringup(692, 3034)]
    assert set(rows) == set(names)
    for n, cells in rows.items():
        bound, by, pred, meas, verdict = cells[5], cells[6], cells[7], cells[8], cells[10]
        if "_sq1_" in n:
            assert (bound, by, pred) == ("memory", "copy ratio", "1.41×"), n
        else:
            assert (bound, by, pred) == ("compute", "bf16 GEMM ratio", "0.97×"), n
        # naive runs at 70% of its bound on B: flagged; every other variant reaches its bound
        assert verdict == ("below bound" if n.startswith("naive/") else "as bound"), n
    assert "gains less than 90% of its prediction: 7 of 35 points" in index
    assert "| naive | 7 | 4 compute, 3 memory | 0.68× | 0.97× | 70% | 70% | 7 |" in md
    assert "| flash_decoding | 3 | 3 memory | 1.41× | 1.41× | 100% | 100% | 0 |" in md
    assert {"fa3_fp8", "flash_decoding", "fa3_pipelined", "fa1_kv_outer", "fa2_q_outer", "naive"} <= {
        n.split("/")[0] for n in rows}
    assert {f for f in os.listdir(out / "figures")} == {"bringup_speedup.png", "bringup_abs.png", "bringup_norm.png"}
    # a looser tolerance flags nothing
    assert main(["bringup", a, b, "-o", str(d / "bringup2"), "--tolerance", "0.6"]) == 0
    verdicts = [line.rsplit("|", 2)[1].strip() for line in (d / "bringup2" / "bringup.md").read_text().splitlines()
                if line.startswith("| `")]
    assert len(verdicts) == 35 and "below bound" not in verdicts


def test_bringup_without_ceilings_says_why_and_still_compares(tmp_path, capsys):
    recs = synth.bringup(692, 3034)
    a = synth.write(tmp_path / "a.json", _doc(recs, synth.H100, None))
    b = synth.write(tmp_path / "b.json", _doc(recs, synth.H200, H200_CEIL))
    out = tmp_path / "out"
    assert main(["bringup", a, b, "-o", str(out)]) == 0
    index = (out / "index.html").read_text()
    assert "Speed-ups are not explained: no measured bf16 GEMM and copy ceilings" in index and "a.json" in index
    assert "1.00×" in index
    assert main(["bringup", a, b, "-o", str(tmp_path / "o2"), "--tolerance", "1.5"]) == 2
    assert "--tolerance 1.5 is outside (0, 1]" in capsys.readouterr().err
    assert not (tmp_path / "o2").exists()


def test_figure_helpers():
    assert F.text_color_for((0.27, 0.0, 0.33, 1.0)) == "white"   # viridis' dark purple end
    assert F.text_color_for((0.99, 0.91, 0.14, 1.0)) == "black"  # its yellow end
    full = R.point_from_record(dict(synth.record("naive", {}, synth.problem(512), 10),
                                    occupancy={"theoretical_pct": 100.0, "limiter": "registers"}))
    half = R.point_from_record(dict(synth.record("naive", {}, synth.problem(512), 10),
                                    occupancy={"theoretical_pct": 50.0, "limiter": "registers"}))
    assert F.occupancy_label(full) == "not limited (100%)"
    assert F.occupancy_label(half) == "limited by registers"


def test_layout_check_catches_overlapping_text_and_covering_legends():
    plt = F.plt()
    fig, axes = plt.subplots(2, 1, figsize=(3, 2))  # no layout engine: the title of the lower panel hits the labels
    for ax in axes:
        ax.plot([1, 2], [1, 2], label="a long legend entry")
        ax.set_title("a title long enough to collide with the row above")
        ax.set_xlabel("x label")
        ax.legend(loc="center")
    problems = F.layout_problems(fig)
    plt.close(fig)
    assert any("overlaps" in p for p in problems) and any("legend covers" in p for p in problems)


def test_make_examples_writes_every_page_in_one_command(tmp_path, capsys):
    import importlib.util
    spec = importlib.util.spec_from_file_location("make_examples", os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts", "make_examples.py"))
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    recs = [r for r in synth.bringup(692, 3034) if r["variant"] in ("flash_decoding", "fa2_q_outer")]
    a = synth.write(tmp_path / "h100.json", _doc(recs, synth.H100, H100_CEIL))
    b = synth.write(tmp_path / "h200.json", _doc(recs, synth.H200, H200_CEIL))
    out = tmp_path / "examples"
    (out / "h200-quick" / "figures").mkdir(parents=True)
    (out / "h200-quick" / "figures" / "stale.png").write_bytes(b"old")
    assert mk.main(["--quick", b, "--bringup", a, b, "--out", str(out), "--no-screenshots"]) == 0
    assert (out / "h200-quick" / "index.html").exists() and not (out / "h200-quick" / "figures" / "stale.png").exists()
    assert (out / "bringup-h100-h200" / "bringup.md").exists()
    assert "data:image" not in (out / "bringup-h100-h200" / "index.html").read_text()  # figures linked
    assert mk.main(["--quick", b, "--bringup", a, str(tmp_path / "missing.json"), "--out", str(tmp_path / "o2")]) == 2
    assert "missing.json" in capsys.readouterr().err and not (tmp_path / "o2").exists()


# ---- headless Chromium ----------------------------------------------------------------------------------------------

@pytest.fixture
def shot_dir(request, tmp_path):
    d = request.config.getoption("--screenshot-dir")
    if d:
        os.makedirs(d, exist_ok=True)
        return d
    return str(tmp_path)


def _history_db(tmp_path):
    db = str(tmp_path / "h.sqlite")
    p = synth.problem(2048)
    for night, med in enumerate([100, 100.1, 99.9, 100, 106, 106.1, 95]):
        rng = random.Random(night)
        recs = [synth.record("fa2_q_outer", {"block_m": 128}, p, med, cv=0.003, n=40, rng=rng),
                synth.record("fa1_kv_outer", {"block_m": 64}, p, 300, cv=0.003, n=40, rng=rng)]
        doc = synth.doc(recs, git_sha="sha{:04d}".format(night))
        doc["context"]["date"] = "2025-01-{:02d}T03:00:00+00:00".format(night + 1)
        assert main(["history", "ingest", synth.write(tmp_path / "n{}.json".format(night), doc), "--db", db]) == 0
    return db


@pytest.mark.skipif(page.find_chromium() is None, reason="chromium not installed (apt-get install -y chromium); "
                                                          "skipping the headless-browser screenshots of the pages")
def test_pages_render_in_headless_chromium(two_gpus, tmp_path, shot_dir, monkeypatch):
    import numpy as np
    from matplotlib import image
    d, a, b, c = two_gpus
    pages = {}
    assert main(["html", a, c, b, "-o", str(tmp_path / "html")]) == 0
    pages["html"] = tmp_path / "html" / "index.html"
    assert main(["bringup", a, b, "-o", str(tmp_path / "bringup")]) == 0
    pages["bringup"] = tmp_path / "bringup" / "index.html"
    monkeypatch.setattr(F, "CHECK_LAYOUT", False)  # history's figures are not this file's to check
    db = _history_db(tmp_path)
    assert main(["history", "plot", "--db", db, "-o", str(tmp_path / "history")]) == 0
    pages["history"] = tmp_path / "history" / "index.html"
    for name, html in pages.items():
        png = os.path.join(shot_dir, "screenshot-{}.png".format(name))
        info = page.screenshot(str(html), png)
        n_img = html.read_text().count("<img ")
        assert info["images"] == "{0}/{0}".format(n_img), (name, info)
        assert not info["truncated"], (name, info)
        px = image.imread(png)
        assert px.shape[0] >= info["height"] and px.shape[1] == 1400, (name, px.shape)
        assert float(np.std(px[..., :3])) > 0.01, name + " screenshot is blank"
        # nothing is wider than the window: the last column of pixels is page background
        assert float(np.std(px[:, -3:, :3])) < 0.02, name + ": content runs off the right edge"
