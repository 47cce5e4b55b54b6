import json
import os
import subprocess
import sys

import pytest

from flashbench_reports import results

from conftest import PEERS


def _brute(sq, skv, causal):
    return sum(1 for i in range(sq) for j in range(skv) if not causal or j <= i + skv - sq)


@pytest.mark.parametrize("sq,skv", [(1, 1), (7, 7), (5, 9), (9, 5), (1, 33), (33, 1), (16, 64), (64, 16), (3, 100)])
@pytest.mark.parametrize("causal", [False, True])
def test_unmasked_pairs_bottom_right(peers, sq, skv, causal):
    p = peers.normalize_problem({"seqlen_q": sq, "seqlen_kv": skv, "causal": causal, "heads_q": 2})
    assert peers.unmasked_pairs(p) == _brute(sq, skv, causal)
    assert peers.flops(p) == 4 * 2 * 64 * _brute(sq, skv, causal)


def test_records_follow_the_schema(peers, tmp_path):
    p = peers.normalize_problem({"batch": 2, "heads_q": 8, "heads_kv": 2, "seqlen_q": 128, "seqlen_kv": 256,
                                 "head_dim": 64, "causal": True, "dtype": "f16"})
    timing = dict(peers.summarize([10.0, 11.0, 10.5]), samples_us=[10.0, 11.0, 10.5], noisy=True)
    ok = peers.record("torch_flash", p, "ok", timing=timing)
    sk = peers.record("torch_cudnn", p, "skipped", "no GQA")
    assert ok["name"] == "peer:torch_flash/b2_hq8_hkv2_sq128_skv256_d64_causal_fp16"
    assert sk["error_occurred"] and sk["real_time"] == 0 and sk["tflops"] is None
    f = tmp_path / "peers.json"
    peers.write_atomic(str(f), {"context": {"schema_version": 1}, "benchmarks": [ok, sk]})
    r = results.load(str(f))
    assert [x.status for x in r.points] == ["ok", "skipped"]
    assert r.points[0].median_us == 10.5 and r.points[0].key == ok["name"].split("/")[1]


def test_record_samples_are_kept_to_the_nanosecond_and_subsampled(peers):
    p = peers.normalize_problem({"seqlen_q": 64, "seqlen_kv": 64})
    s = [10.0 + i * 1e-4 + 1.23456e-5 for i in range(3000)]
    rec = peers.record("torch_flash", p, "ok", timing=dict(peers.summarize(s), samples_us=s))
    assert len(rec["samples_us"]) == 1000 and rec["iterations"] == 3000
    assert rec["samples_us"][1] == round(s[3], 3) and all(round(x, 3) == x for x in rec["samples_us"])
    assert rec["median_us"] == peers.summarize(s)["median_us"]  # the statistics come from the unrounded samples


def test_without_torch_prints_one_line_and_writes_nothing(tmp_path):
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed here; the no-torch path cannot be exercised")
    except ImportError:
        pass
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"problems": [{"seqlen_q": 128, "seqlen_kv": 128, "heads_q": 4}]}))
    out = tmp_path / "peers.json"
    r = subprocess.run([sys.executable, PEERS, "--problems", str(plan), "-o", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.count("\n") == 1 and "torch" in r.stdout
    assert not out.exists()


def test_ours_needs_no_config(tmp_path):
    # `--ours auto` (the library's own choice) and `--ours VARIANT` (each problem's default config) pass the argument
    # checks without --ours-config or --ours-best; without torch they then stop before loading anything.
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed here; the run would go on to load the library")
    except ImportError:
        pass
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"problems": [{"seqlen_q": 128, "seqlen_kv": 128, "heads_q": 4}]}))
    for ours in (["auto"], ["auto", "--ours-config", "auto"], ["fa3_pipelined"]):
        r = subprocess.run([sys.executable, PEERS, "--problems", str(plan), "-o", str(tmp_path / "o.json"),
                            "--ours"] + ours, capture_output=True, text=True)
        assert r.returncode == 0 and "torch" in r.stdout, r.stderr


def test_a_spec_is_planned_by_the_flashbench_binary(peers, tmp_path):
    # A stand-in binary that prints a plan for `plan SPEC`, and one that fails as flashbench does on a bad spec.
    fake = tmp_path / "flashbench"
    fake.write_text("#!/bin/sh\n[ \"$1\" = plan ] || exit 9\n"
                    "echo '{\"problems\": [{\"seqlen_q\": 64, \"heads_q\": 2}, {\"seqlen_q\": 64, \"heads_q\": 2}], "
                    "\"timing_policy\": {\"min_samples\": 7}}'\n")
    fake.chmod(0o755)
    spec = tmp_path / "s.yaml"
    spec.write_text("name: s\n")
    probs, _, timing = peers.load_plan(str(spec), str(fake))
    assert len(probs) == 1 and probs[0]["seqlen_q"] == 64 and timing == {"min_samples": 7}
    bad = tmp_path / "bad"
    bad.write_text("#!/bin/sh\necho 'flashbench: s.yaml:1: unknown field' >&2\nexit 2\n")
    bad.chmod(0o755)
    with pytest.raises(peers.UserError, match="unknown field"):
        peers.load_plan(str(spec), str(bad))
    with pytest.raises(peers.UserError, match="--flashbench"):
        peers.load_plan(str(spec), str(tmp_path / "missing"))


def test_bad_plan_is_a_user_error(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('{"problems": [{"seqlen_q": 0}]}')
    r = subprocess.run([sys.executable, PEERS, "--problems", str(plan), "-o", str(tmp_path / "o.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_ours_records_are_named_as_flashbench_names_them(peers):
    p = peers.normalize_problem({"seqlen_q": 512, "heads_q": 16, "head_dim": 128, "batch": 32})
    timing = dict(peers.summarize([100.0, 101.0]), samples_us=[100.0, 101.0])
    r = peers.record("fa3_pipelined", p, "ok", timing=timing, config_str="block_m=128,pingpong=on", rep=(2, 3))
    assert r["name"] == "fa3_pipelined/block_m=128,pingpong=on/b32_hq16_hkv16_sq512_skv512_d128_bf16"
    assert r["variant"] == "fa3_pipelined" and r["config"] == {"block_m": "128", "pingpong": "on"}
    assert (r["repetition_index"], r["repetitions"]) == (2, 3)
    assert peers.record("torch_cudnn", p, "ok", timing=timing)["variant"] == "peer:torch_cudnn"


def test_ours_best_ranks_verified_configs_by_their_fastest_sample(peers, tmp_path):
    p = {"batch": 4, "heads_q": 16, "heads_kv": 16, "seqlen_q": 4096, "seqlen_kv": 4096, "head_dim": 128,
         "causal": False, "dtype": "bf16", "layout": "bshd", "scale": 0.0}
    # a=1's median is slower (a power-capped phase) but its fastest sample is the fastest: it ranks first
    recs = [{"variant": "fa3_pipelined", "status": "ok", "tflops": 700.0, "min_us": 750.0, "config_str": "a=1",
             "problem": p},
            {"variant": "fa3_pipelined", "status": "ok", "tflops": 720.0, "min_us": 790.0, "config_str": "a=2",
             "problem": p},
            {"variant": "fa3_pipelined", "status": "ok", "tflops": 710.0, "min_us": 780.0, "config_str": "a=5",
             "problem": p},
            {"variant": "fa3_pipelined", "status": "incorrect", "tflops": 900.0, "min_us": 1.0, "config_str": "a=3",
             "problem": p},
            {"variant": "fa2_q_outer", "status": "ok", "tflops": 950.0, "min_us": 1.0, "config_str": "a=4",
             "problem": p}]
    f = tmp_path / "r.json"
    f.write_text(json.dumps({"benchmarks": recs}))
    key = "b4_hq16_hkv16_sq4096_skv4096_d128_bf16"
    assert peers.best_configs(str(f), "fa3_pipelined") == {key: ["a=1"]}
    assert peers.best_configs(str(f), "fa3_pipelined", 2) == {key: ["a=1", "a=5"]}
    with pytest.raises(peers.UserError, match="no verified point of naive"):
        peers.best_configs(str(f), "naive")


class _FakePeer:
    config, poison = "", None

    def close(self):
        pass

    def __init__(self, name, p, log, skip=None):
        self.name, self.p, self.log, self.skip, self.extra = name, p, log, skip, {}

    def skip_reason(self):
        return self.skip

    def build(self, q, k, v):
        return lambda: self.log.append(("call", self.name)) or _Out()


class _Out:
    def clone(self):
        return self


class _FakeCudaTorch:
    class cuda:
        OutOfMemoryError = MemoryError

        @staticmethod
        def synchronize():
            pass

        @staticmethod
        def Stream():
            raise RuntimeError("no graphs here")  # as_graph falls back to the eager call


class _OrderTimer:
    def __init__(self, log):
        self.log = log

    def measure(self, fn):
        fn()
        self.log.append("measured")
        return dict(peers_summary(), samples_us=[10.0, 10.0])


def peers_summary():
    return {"median_us": 10.0, "min_us": 10.0, "max_us": 10.0, "mean_us": 10.0, "cv": 0.0}


def test_rounds_time_every_peer_in_turn_the_order_reversed_each_round(peers, monkeypatch):
    monkeypatch.setattr(peers.runner, "make_inputs", lambda torch, p, seed, device: (1, 2, 3))
    p = peers.normalize_problem({"seqlen_q": 64, "heads_q": 2})
    log = []
    bound = [_FakePeer("a", p, log), _FakePeer("b", p, log), _FakePeer("c", p, log, skip="cannot")]
    recs = peers.run_problem(_FakeCudaTorch, _OrderTimer(log), bound, p, 7, False, 3)
    timed = [log[i - 1][1] for i, x in enumerate(log) if x == "measured"]  # the call each measure() made
    assert timed == ["a", "b", "b", "a", "a", "b"]
    assert [(r["variant"], r["status"], r["repetition_index"]) for r in recs] == [
        ("peer:c", "skipped", 0), ("peer:a", "ok", 0), ("peer:b", "ok", 0), ("peer:b", "ok", 1), ("peer:a", "ok", 1),
        ("peer:a", "ok", 2), ("peer:b", "ok", 2)]
    assert all(r["repetitions"] == 3 for r in recs if r["status"] == "ok")
    assert all(r["launch"].startswith("eager") for r in recs if r["status"] == "ok")


@pytest.mark.parametrize("argv,what", [
    (["--ours-config", "default"], "need --ours"),
    (["--ours", "fa3_pipelined", "--ours-config", "default", "--ours-best", "x.json"], "one of"),
    (["--ours", "fa3_pipelined", "--ours-config", "default", "--ours-top", "2"], "--ours-top 2"),
    (["--ours", "auto", "--ours-best", "x.json"], "--ours auto picks the config"),
    (["--ours", "auto", "--ours-config", "block_m=64"], "--ours auto picks the config"),
    (["--rounds", "0"], "--rounds"),
    (["-o", "."], "is a directory"),
])
def test_bad_ours_arguments_are_one_line_user_errors(tmp_path, argv, what):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"problems": [{"seqlen_q": 128, "seqlen_kv": 128, "heads_q": 4}]}))
    r = subprocess.run([sys.executable, PEERS, "--problems", str(plan), "-o", str(tmp_path / "o.json")] + argv,
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and what in r.stderr, r.stderr
    assert not (tmp_path / "o.json").exists()


def test_reports_read_the_first_round_of_a_rounds_file(peers, tmp_path):
    p = peers.normalize_problem({"seqlen_q": 256, "heads_q": 4})
    recs = [peers.record("torch_cudnn", p, "ok", timing=dict(peers.summarize([t, t]), samples_us=[t, t]), rep=(i, 3))
            for i, t in enumerate([10.0, 20.0, 30.0])]
    f = tmp_path / "ab.json"
    peers.write_atomic(str(f), {"context": {"schema_version": 1}, "benchmarks": recs})
    r = results.load(str(f))
    assert [x.median_us for x in r.points] == [10.0]


def _peer_table(peers, tmp_path, recs, variant="fa3_pipelined"):
    """Writes recs as a peers.py results file and runs scripts/peer_table.py on it (one-file mode)."""
    f = tmp_path / "ab.json"
    peers.write_atomic(str(f), {"context": {"schema_version": 1}, "benchmarks": recs})
    table = os.path.join(os.path.dirname(PEERS), "peer_table.py")
    return subprocess.run([sys.executable, table, str(f), "--variant", variant], capture_output=True, text=True)


def _timing(peers, us, busy):
    return dict(peers.summarize([us, us]), samples_us=[us, us], sm_clock_mhz=1980, busy_fraction=busy)


def test_peer_table_pairs_rounds_and_gives_the_median_ratio(peers, tmp_path):
    p = peers.normalize_problem({"seqlen_q": 512, "heads_q": 16, "head_dim": 128, "batch": 32, "causal": True})
    t = lambda us: _timing(peers, us, 0.7)
    recs = []
    # ours / cuDNN per round: 1.0, 0.5, 2.0 -> median 1.0 over the range 0.5-2.0 (times are inverse to TFLOP/s)
    for i, (ours, cudnn) in enumerate([(100.0, 100.0), (200.0, 100.0), (50.0, 100.0)]):
        recs.append(peers.record("fa3_pipelined", p, "ok", timing=t(ours), config_str="block_m=128", rep=(i, 3)))
        recs.append(peers.record("torch_cudnn", p, "ok", timing=t(cudnn), rep=(i, 3)))
    r = _peer_table(peers, tmp_path, recs)
    assert r.returncode == 0, r.stderr
    row = r.stdout.splitlines()[1].split()
    assert row[:3] == ["d128", "N512", "causal"] and row[5] == "1.000" and row[6] == "0.500-" and row[7] == "2.000"
    r = _peer_table(peers, tmp_path, recs, "naive")
    assert r.returncode == 2 and "no verified point of naive" in r.stderr


def test_peer_table_chooses_among_configs_on_round_0_and_grades_on_the_later_rounds(peers, tmp_path):
    p = peers.normalize_problem({"seqlen_q": 4096, "heads_q": 16, "head_dim": 128, "batch": 4})
    t = lambda us: _timing(peers, us, 0.9)
    recs = []
    # round 0: a=1 (ratio 1.25) beats a=2 (1.111); later rounds: a=1 at 1.0 and 1.053, a=2 at 2.0 and 2.0.
    # Chosen on round 0 -> a=1, graded on rounds 1-2 -> median 1.026, never a=2's later (unchosen) rounds
    for i, (a1, a2, cudnn) in enumerate([(80.0, 90.0, 100.0), (100.0, 50.0, 100.0), (95.0, 50.0, 100.0)]):
        recs.append(peers.record("fa3_pipelined", p, "ok", timing=t(a1), config_str="a=1", rep=(i, 3)))
        recs.append(peers.record("fa3_pipelined", p, "ok", timing=t(a2), config_str="a=2", rep=(i, 3)))
        recs.append(peers.record("torch_cudnn", p, "ok", timing=t(cudnn), rep=(i, 3)))
    r = _peer_table(peers, tmp_path, recs)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    row = lines[1].split()
    assert row[:2] == ["d128", "N4096"] and row[4] == "1.026" and row[5] == "1.000-" and row[6] == "1.053"
    assert row[-1] == "a=1" and "chosen by its ratio in round 0" in lines[-1]


class _PairTimer(_OrderTimer):
    def measure_many(self, fns):
        for f in fns:
            f()
        self.log.append(("many", len(fns)))
        return [dict(peers_summary(), samples_us=[10.0, 10.0]) for _ in fns]


def test_interleave_sample_times_all_peers_in_one_loop_per_round(peers, monkeypatch):
    monkeypatch.setattr(peers.runner, "make_inputs", lambda torch, p, seed, device: (1, 2, 3))
    p = peers.normalize_problem({"seqlen_q": 64, "heads_q": 2})
    log = []
    bound = [_FakePeer("a", p, log), _FakePeer("b", p, log)]
    recs = peers.run_problem(_FakeCudaTorch, _PairTimer(log), bound, p, 7, False, 2, interleave="sample")
    assert log.count(("many", 2)) == 2 and "measured" not in log
    assert [(r["variant"], r["repetition_index"]) for r in recs] == [
        ("peer:a", 0), ("peer:b", 0), ("peer:b", 1), ("peer:a", 1)]


def test_partial_records_are_whole_lines_on_disk(peers, tmp_path):
    p = peers.normalize_problem({"seqlen_q": 64, "heads_q": 2})
    path = tmp_path / "peers.json.partial.jsonl"
    with open(path, "w") as f:
        peers.append_partial(f, peers.record("torch_cudnn", p, "skipped", "x"))
        peers.append_partial(f, peers.record("flex", p, "skipped", "y"))
        lines = path.read_text().splitlines()  # readable before the file is closed: each line is flushed
    assert [json.loads(x)["variant"] for x in lines] == ["peer:torch_cudnn", "peer:flex"]


def test_peer_table_keeps_paged_and_unpaged_decode_apart(peers, tmp_path):
    t = lambda us: _timing(peers, us, 0.8)
    recs = []
    for page, (ours, cudnn) in ((0, (10.0, 20.0)), (16, (40.0, 20.0))):
        p = peers.normalize_problem({"seqlen_q": 1, "seqlen_kv": 8192, "heads_q": 32, "heads_kv": 8,
                                     "head_dim": 128, "batch": 4, "page_size": page})
        recs.append(peers.record("flash_decoding", p, "ok", timing=t(ours), config_str="splits=4"))
        recs.append(peers.record("torch_cudnn", p, "ok", timing=t(cudnn)))
    r = _peer_table(peers, tmp_path, recs, "flash_decoding")
    assert r.returncode == 0, r.stderr
    rows = [x.split() for x in r.stdout.splitlines()[1:]]
    # unpaged ours 10 us vs cuDNN 20 us -> 2.0; paged 40 us vs the same cuDNN 20 us -> 0.5 (was one row)
    assert [x[:8] for x in rows] == [["d128", "B4", "H32/8", "q1", "kv8192", "53.7", "26.8", "2.000"],
                                     ["d128", "B4", "H32/8", "q1", "kv8192", "page16", "13.4", "26.8"]]
    assert rows[1][8] == "0.500"


def test_a_skip_before_the_config_is_resolved_keeps_its_name():
    # --ours VARIANT --ours-config default on a problem the variant refuses: the record is a skip, not a crash
    from flashbench_reports.peers.records import record
    p = {"batch": 1, "heads_q": 2, "heads_kv": 2, "seqlen_q": 8, "seqlen_kv": 8, "head_dim": 64, "causal": False,
         "dtype": "bf16", "layout": "bshd", "scale": 0.0}
    r = record("fa3_fp8", p, "skipped", "bf16 inputs: fa3_fp8 takes e4m3", config_str="default")
    assert r["status"] == "skipped" and r["config"] == {} and r["name"].startswith("fa3_fp8/default/")


def test_ours_names_the_librarys_build_not_the_checkout():
    """peers.py --ours records the build the C API library was made from (fb_capi_build): on a GPU runner the library
    may come from another commit than the checkout peers.py runs in. The built library, where this tree has one."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(os.environ.get("FLASHBENCH_BUILD_DIR") or os.path.join(root, "build"), "libflashbench_capi.so")
    if not os.path.exists(path):
        pytest.skip("no built library at " + path)
    from flashbench_reports.peers.capi import CapiLib
    b = CapiLib(path).build
    assert set(b) == {"source_sha", "options", "toolkit"}
    assert b["source_sha"] and "cuda_arch=" in b["options"] and "nvcc" in b["toolkit"]
