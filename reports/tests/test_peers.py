import json
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


def test_bad_plan_is_a_user_error(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text('{"problems": [{"seqlen_q": 0}]}')
    r = subprocess.run([sys.executable, PEERS, "--problems", str(plan), "-o", str(tmp_path / "o.json")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
