"""flashbench_reports/problem.py: the one Python copy of the harness's problem math. The CTest
problem_math_python_matches_cpp (check_problem_math.py) compares it with the C++ on every shipped spec; these
tests pin what the reports and peers.py rely on."""
import pytest

from flashbench_reports import problem as P
from flashbench_reports import results
from flashbench_reports import peers


def _decode(**kw):
    p = {"batch": 4, "heads_q": 32, "heads_kv": 8, "seqlen_q": 1, "seqlen_kv": 8192, "head_dim": 128,
         "causal": False, "dtype": "bf16", "layout": "bshd", "scale": 0.0}
    p.update(kw)
    return p


def _brute_pairs(sq, skv, causal):
    return sum(1 for i in range(sq) for j in range(skv) if not causal or j <= i + skv - sq)


def test_peers_and_reports_share_one_copy():
    assert peers.problem_key is P.problem_key and results.problem_key is P.problem_key
    assert peers.flops is P.flops and peers.bytes_min is P.bytes_min and peers.TOLERANCE is P.TOLERANCE


def test_key_suffixes_in_the_harness_order():
    assert P.problem_key(_decode()) == "b4_hq32_hkv8_sq1_skv8192_d128_bf16"
    assert P.problem_key(_decode(kv_lens=[1, 257, 0, 8192], page_size=16)) == \
        "b4_hq32_hkv8_sq1_skv8192_d128_bf16_kvl1-257-0-8192_page16"
    assert P.problem_key(_decode(layout="bhsd", scale=0.125, causal=True, dtype="f16")) == \
        "b4_hq32_hkv8_sq1_skv8192_d128_causal_fp16_bhsd_scale0.125"
    many = list(range(1, 11))
    h = 0xcbf29ce484222325
    for x in many:
        h = ((h ^ x) * 0x100000001b3) % (1 << 64)
    assert P.problem_key(_decode(batch=10, kv_lens=many)).endswith("_kvl55x{:08x}".format(h & 0xffffffff))


def test_paged_and_unpaged_decode_are_different_points_in_the_reports():
    recs = [{"name": "flash_decoding/c/k{}".format(i), "variant": "flash_decoding", "status": "ok", "median_us": us,
             "problem": _decode(**extra)} for i, (us, extra) in enumerate([(10.0, {}), (20.0, {"page_size": 16}),
                                                                          (30.0, {"kv_lens": [5, 6, 7, 8]})])]
    best = results.best_per_variant([results.point_from_record(r) for r in recs])
    assert sorted(p.median_us for p in best.values()) == [10.0, 20.0, 30.0]


@pytest.mark.parametrize("key", ["b1_hq16_hkv16_sq1024_skv1024_d128_causal_bf16",
                                 "b2_hq8_hkv2_sq100_skv333_d64_causal_e4m3_bhsd_scale0.0883883",
                                 "b4_hq32_hkv8_sq1_skv8192_d128_bf16_kvl1-257-0-8192_page16",
                                 "b8_hq32_hkv8_sq1_skv32768_d128_bf16_page64",
                                 "b2_hq8_hkv2_sq4096_skv4096_d128_causal_e4m3_hadamard_bhsd"])
def test_parse_gives_the_key_back(key):
    assert P.problem_key(P.parse_problem_key(key)) == key


def test_parse_refuses_what_the_key_does_not_hold():
    assert P.parse_problem_key("b10_hq8_hkv8_sq1_skv64_d64_bf16_kvl55x1a2b3c4d") == {}
    assert P.parse_problem_key("not a key") == {}
    # a record without a problem and with a name that is no key keeps its own name as key, not "?"
    pt = results.point_from_record({"name": "x/y/custom-shape", "status": "ok", "median_us": 1.0})
    assert pt.key == "custom-shape"


def test_flops_and_bytes_count_each_entry_with_its_own_length():
    lens = [3, 64, 0, 17]
    p = P.normalize_problem(_decode(seqlen_q=4, seqlen_kv=64, causal=True, kv_lens=lens))
    pairs = sum(_brute_pairs(4, n, True) for n in lens)
    assert P.flops(p) == 4 * 32 * 128 * pairs
    assert P.kv_bytes(p) == 2 * 2 * sum(lens) * 8 * 128
    assert P.bytes_min(p) == (2 + 2) * 4 * 32 * 4 * 128 + P.kv_bytes(p) + 4 * 4 * 32 * 4
    e4m3 = P.normalize_problem(_decode(dtype="e4m3"))
    assert P.bytes_min(e4m3) == (1 + 2) * 4 * 32 * 1 * 128 + 2 * 1 * 4 * 8192 * 8 * 128 + 4 * 4 * 32


def test_normalize_refuses_what_the_harness_refuses():
    with pytest.raises(P.UserError, match="kv_lens"):
        P.normalize_problem(_decode(kv_lens=[1, 2]))
    with pytest.raises(P.UserError, match="multiple"):
        P.normalize_problem(_decode(heads_kv=5))


def test_paged_and_unpaged_decode_are_different_curves():
    fam = {results.family_key(_decode(**extra)) for extra in ({}, {"page_size": 16}, {"page_size": 64},
                                                              {"kv_lens": [1, 2, 3, 4]})}
    assert len(fam) == 4
    assert results.family_key(_decode(page_size=16)) == results.family_key(_decode(page_size=16, seqlen_kv=4096))


def _prefill(**kw):
    p = {"batch": 2, "heads_q": 8, "heads_kv": 2, "seqlen_q": 100, "seqlen_kv": 333, "head_dim": 64,
         "causal": True, "dtype": "bf16", "layout": "bshd", "scale": 0.0}
    p.update(kw)
    return p


def test_backward_key_flops_and_bytes():
    fwd, bwd = P.normalize_problem(_prefill()), P.normalize_problem(_prefill(**{"pass": "bwd"}))
    assert fwd["pass"] == "fwd"  # a record without a pass is a forward
    assert P.problem_key(bwd) == P.problem_key(fwd) + "_bwd"
    assert P.parse_problem_key(P.problem_key(bwd))["pass"] == "bwd"
    assert P.problem_key(P.parse_problem_key(P.problem_key(bwd))) == P.problem_key(bwd)
    pairs = 2 * _brute_pairs(100, 333, True)
    assert P.flops(fwd) == 4 * 8 * 64 * pairs
    assert P.flops(bwd) == 2.5 * P.flops(fwd)
    q, kv, lse = 2 * 8 * 100 * 64 * 2, 2 * 2 * 333 * 64 * 2, 4 * 2 * 8 * 100
    assert P.bytes_min(bwd) == (q + kv + kv + q + q + lse) + (q + kv + kv)  # read Q K V O dO LSE, write dQ dK dV
    assert P.normalize_problem(_prefill(**{"pass": "backward"}))["pass"] == "bwd"


def test_normalize_refuses_a_backward_the_harness_refuses():
    for extra in ({"dtype": "e4m3"}, {"layout": "bhsd"}, {"page_size": 16}, {"batch": 2, "kv_lens": [3, 4]}):
        with pytest.raises(P.UserError, match="pass: bwd"):
            P.normalize_problem(_prefill(**dict(extra, **{"pass": "bwd"})))
    with pytest.raises(P.UserError, match="pass must be fwd or bwd"):
        P.normalize_problem(_prefill(**{"pass": "sideways"}))


def test_backward_points_are_their_own_points_and_curves():
    recs = [{"name": "v/c/k{}".format(i), "variant": "v", "status": "ok", "median_us": us, "problem": _prefill(**extra)}
            for i, (us, extra) in enumerate([(10.0, {}), (30.0, {"pass": "bwd"})])]
    points = [results.point_from_record(r) for r in recs]
    assert points[1].key.endswith("_bwd") and not points[0].key.endswith("_bwd")
    assert sorted(p.median_us for p in results.best_per_variant(points).values()) == [10.0, 30.0]
    assert results.family_key(_prefill(**{"pass": "bwd"})) == results.family_key(_prefill()) + " bwd"


def test_quant_is_an_e4m3_field_with_its_key_suffix():
    p = _decode(dtype="e4m3", quant="block_hadamard", seqlen_q=4096, seqlen_kv=4096, batch=1)
    assert P.problem_key(p) == "b1_hq32_hkv8_sq4096_skv4096_d128_e4m3_hadamard"
    assert P.problem_key(dict(p, quant="block")) == "b1_hq32_hkv8_sq4096_skv4096_d128_e4m3"
    assert P.normalize_problem(dict(p, quant=None))["quant"] == "block"  # records before the option
    with pytest.raises(P.UserError, match="use dtype e4m3"):
        P.normalize_problem(dict(p, dtype="bf16"))
    with pytest.raises(P.UserError, match="block or block_hadamard"):
        P.normalize_problem(dict(p, quant="rotated"))
    # the rotated and the plain inputs are two curves of a report, not two points of one
    assert results.family_key(p) != results.family_key(dict(p, quant="block"))
