"""The nightly gate on real data: two runs of one build on two hosts of a pool (tests/data/nightly-two-hosts)."""
import copy
import json
import os

import pytest

from flashbench_reports import compare, history
from flashbench_reports import results as R
from flashbench_reports.cli import main

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "nightly-two-hosts")
BASE = os.path.join(DATA, "baseline-host1-h200.json")
CUR = os.path.join(DATA, "current-host2-h200.json")


def _load(path):
    with open(path) as f:
        return json.load(f)


def _scaled(doc, name, factor):
    d = copy.deepcopy(doc)
    for r in d["benchmarks"]:
        if r["name"] == name:
            r["samples_us"] = [s * factor for s in r["samples_us"]]
            for f in ("median_us", "real_time", "cpu_time", "min_us", "max_us", "mean_us"):
                r[f] *= factor
    return d


def _write(tmp_path, name, doc):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def _clean_names():
    b, c = R.load(BASE).by_name(), R.load(CUR).by_name()
    return [n for n in b if b[n].ok and c[n].ok and not b[n].noisy and not c[n].noisy]


def test_fixture_pair_has_no_regression(tmp_path, capsys):
    out = tmp_path / "t.md"
    assert main(["compare", BASE, CUR, "-o", str(out)]) == 0
    text = out.read_text()
    assert "PASS" in text and "| regression" not in text
    assert "no GPU UUID or host id" in text  # the files cannot tell their hosts apart, and compare says so


def test_one_point_scaled_by_five_percent_is_the_only_regression(tmp_path, capsys):
    cur = _load(CUR)
    name = "fa2_q_outer/block_m=128,block_n=64,warps=8,stages=2,warp_layout=split_q/" \
           "b16_hq32_hkv32_sq1024_skv1024_d64_bf16"
    c = _write(tmp_path, "cur.json", _scaled(cur, name, 1.05))
    out = tmp_path / "t.md"
    assert main(["compare", BASE, c, "-o", str(out)]) == 1
    reg = [l for l in out.read_text().splitlines() if l.startswith("| regression")]
    assert len(reg) == 1 and "`{}`".format(name) in reg[0]


def test_every_clean_point_scaled_by_five_percent_is_flagged_alone():
    base, cur = R.load(BASE), _load(CUR)
    names = _clean_names()
    assert len(names) >= 60
    for name in names:
        doc = _scaled(cur, name, 1.05)
        scaled = R.Results(CUR, doc["context"], [R.point_from_record(r) for r in doc["benchmarks"]])
        rows = compare.collect(base, scaled, 0.02, 0.05)
        flagged = [r.name for r in rows if r.kind == "regression"]
        assert flagged == [name], (name, flagged)
        assert compare.exit_code(rows) == 1


def test_a_noisy_point_never_decides_alone(tmp_path):
    b, c = R.load(BASE).by_name(), R.load(CUR).by_name()
    noisy = next(n for n in b if b[n].ok and b[n].noisy and c[n].noisy)
    p = _write(tmp_path, "cur.json", _scaled(_load(CUR), noisy, 1.05))
    rows = compare.collect(R.load(BASE), R.load(p), 0.02, 0.05)
    row = next(r for r in rows if r.name == noisy)
    assert row.kind == "unknown" and "noise target missed" in row.change.why
    assert compare.exit_code(rows) == 0


def _with_machine(doc, uuid, host):
    d = copy.deepcopy(doc)
    d["context"]["machine"] = {"gpu_uuid": uuid, "host_id": host, "source": "nvml"}
    return d


def test_different_hosts_without_history_need_a_paired_run(tmp_path, capsys):
    b = _write(tmp_path, "b.json", _with_machine(_load(BASE), "GPU-aaaa", "host-a"))
    c = _write(tmp_path, "c.json", _with_machine(_load(CUR), "GPU-bbbb", "host-b"))
    out = tmp_path / "t.md"
    assert main(["compare", b, c, "-o", str(out)]) == compare.EXIT_NEEDS_PAIRED == 3
    text = out.read_text()
    assert "different hosts: a verdict needs a paired run" in text
    assert "different GPUs (GPU-aaaa vs GPU-bbbb)" in text
    assert "| regression" not in text and "| needs paired run" in text
    # a point that fails is a verdict of its own, whatever the hosts
    cur = _with_machine(_load(CUR), "GPU-bbbb", "host-b")
    rec = cur["benchmarks"][0]
    rec.update({"status": "incorrect", "reason": "max error 0.5 > tolerance", "median_us": None})
    assert main(["compare", b, _write(tmp_path, "c2.json", cur)]) == 1


def test_same_gpu_uses_the_pairs_spread(tmp_path):
    name = _clean_names()[0]
    b = _write(tmp_path, "b.json", _with_machine(_load(BASE), "GPU-aaaa", "host-a"))
    c = _write(tmp_path, "c.json", _with_machine(_scaled(_load(CUR), name, 1.05), "GPU-aaaa", "host-a"))
    out = tmp_path / "t.md"
    assert main(["compare", b, c, "-o", str(out)]) == 1
    assert "same GPU (GPU-aaaa)" in out.read_text()


def test_history_supplies_the_spread_between_different_hosts(tmp_path, capsys):
    """Eight runs on eight hosts in history: compare of two of them then decides, from each point's learned spread."""
    import random
    rng = random.Random(3)
    db = str(tmp_path / "h.sqlite")
    base_doc = _load(BASE)
    paths = []
    for i in range(8):
        d = _with_machine(base_doc, "GPU-{:04d}".format(i), "host-{}".format(i))
        d["context"]["date"] = "2026-11-{:02d}T10:00:00+0000".format(i + 1)
        for r in d["benchmarks"]:
            if r.get("status") == "ok":
                f = 1 + rng.gauss(0, 0.004)
                r["median_us"] *= f
                r["samples_us"] = [s * f for s in r["samples_us"]]
        paths.append(_write(tmp_path, "run{}.json".format(i), d))
        assert main(["history", "ingest", paths[-1], "--db", db]) == 0
    spread = history.learned_spread(db, "nvidia-h200")
    assert len(spread) >= 80 and all(0 < v < 0.02 for v in spread.values())
    name = _clean_names()[3]
    last = _load(paths[-1])
    c = _write(tmp_path, "cur.json", _with_machine(_scaled(last, name, 1.05), "GPU-9999", "host-9"))
    out = tmp_path / "t.md"
    assert main(["compare", paths[0], c, "--history", db, "-o", str(out)]) == 1
    text = out.read_text()
    reg = [l for l in text.splitlines() if l.startswith("| regression")]
    assert len(reg) == 1 and name in reg[0]
    assert "history for" in text and "needs paired run" not in text
