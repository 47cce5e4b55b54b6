#!/usr/bin/env python3
"""The Python problem math (flashbench_reports/problem.py) against the C++ harness's, on every problem of every
shipped spec and on a spec of the rarer fields (layout, scale, kv_lens of either key form, paged caches, e4m3).

    check_problem_math.py FLASHBENCH_BIN SWEEPS_DIR

Runs `flashbench plan` for each sweeps/**/*.yaml and compares, per problem, the key the harness gives (and names
its records by) with problem_key() of the problem as peers.py reads it (normalize_problem) and as the reports read
it (the record's raw problem object); FLOPs, bytes_min and kv_bytes likewise; that parse_problem_key gives the
problem back from its key; and that the peers' tolerances are the harness's for e4m3 and the backward and never
stricter elsewhere. Registered in CTest (tests/CMakeLists.txt, label cpu). Exit 1 with the mismatches listed, or
when no spec is found.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from flashbench_reports import problem as P  # noqa: E402
from flashbench_reports import results  # noqa: E402
from flashbench_reports.peers.backward import GRAD_TOLERANCE  # noqa: E402

# Fields no shipped spec uses yet: the key's every suffix (the backward's _bwd, e4m3's _hadamard too) and both kv_lens forms.
RARE = """name: rare-fields
problems:
  - {batch: 2, heads_q: 8, heads_kv: 2, seqlen_q: 100, seqlen_kv: 333, head_dim: 64, causal: true, layout: bhsd,
     scale: 0.0883883476}
  - {batch: 1, heads: 4, seqlen: 128, head_dim: 128, dtype: fp16, scale: 0.5}
  - {heads_q: 16, heads_kv: 2, seqlen_q: 1, seqlen_kv: 4096, head_dim: 128, kv_lens: [1, 257, 0, 4096]}
  - {heads_q: 16, heads_kv: 2, seqlen_q: 4, seqlen_kv: 2048, head_dim: 128, causal: true,
     kv_lens: [7, 2048, 1, 300, 5, 6, 700, 8, 9, 1024], page_size: 64}
  - {batch: 12, heads_q: 8, heads_kv: 8, seqlen_q: 1, seqlen_kv: 8192, head_dim: 64, kv_lens: {random: 7},
     page_size: [0, 16]}
  - {batch: 2, heads: 4, seqlen_q: 300, seqlen_kv: 200, head_dim: 128, causal: true, dtype: e4m3}
  - {batch: 1, heads: 2, seqlen: 4096, head_dim: 128, dtype: e4m3, quant: [block, block_hadamard], layout: bhsd}
  - {batch: 3, heads: 2, seqlen: 77, head_dim: 256, dtype: fp32}
  - {batch: 2, heads_q: 8, heads_kv: 2, seqlen_q: 100, seqlen_kv: 333, head_dim: 64, causal: [false, true],
     pass: [fwd, bwd]}
  - {batch: 1, heads: 4, seqlen_q: 300, seqlen_kv: 200, head_dim: 128, causal: true, dtype: [fp16, fp32], pass: bwd,
     scale: 0.125}
variants: [naive]
"""


def close(a, b):
    return a == b or (a and b and abs(a - b) <= 1e-12 * max(abs(a), abs(b)))


def tolerance_mismatches(dtype, cpp, pass_="fwd"):
    """The peers' check is never stricter than the harness's own (verify.cpp, tolerance_for); for e4m3 it is the
    same bound, and for the backward the same gradient bound (grad_tolerance_for; peers/backward.py)."""
    if pass_ == "bwd":
        ours = GRAD_TOLERANCE[dtype]
        return ["{} backward tolerance {}: C++ {!r} != Python {!r}".format(dtype, k, cpp.get(k), v)
                for k, v in ours.items() if not close(cpp.get(k), v)]
    atol, rtol = P.TOLERANCE[dtype]
    if dtype == "e4m3":
        ours = {"atol": atol, "rtol": rtol, "rel_l2": P.E4M3_REL_L2, "p_round": P.E4M3_P_ROUND}
        return ["e4m3 tolerance {}: C++ {!r} != Python {!r}".format(k, cpp[k], v) for k, v in ours.items()
                if cpp[k] != v]
    return ["{} tolerance {}: Python {!r} is stricter than C++ {!r}".format(dtype, k, v, cpp[k])
            for k, v in (("atol", atol), ("rtol", rtol)) if v < cpp[k]]


def check_spec(fb, path):
    """Mismatch lines for one spec, and the number of problems checked."""
    r = subprocess.run([fb, "plan", path], capture_output=True, text=True)
    if r.returncode != 0:
        return ["{}: flashbench plan failed (exit {}): {}".format(path, r.returncode, r.stderr.strip())], 0
    plan = json.loads(r.stdout)
    probs, derived = plan.get("problems"), plan.get("derived")
    if not isinstance(derived, list) or len(derived) != len(probs):
        return ["{}: the plan has no 'derived' entry per problem (key, flops, bytes_min)".format(path)], 0
    bad = []
    for raw, d in zip(probs, derived):
        want = d["key"]
        q = P.normalize_problem(raw)
        point = results.point_from_record({"name": "v/c/" + want, "variant": "v", "problem": raw, "status": "ok"})
        got = {"peers key": P.problem_key(q), "reports key": point.key}
        parsed = P.parse_problem_key(want)
        if parsed or len(raw.get("kv_lens") or []) <= 8:
            got["key parsed back"] = P.problem_key(parsed)
        for what, k in got.items():
            if k != want:
                bad.append("{}: {}: C++ {} != Python {}".format(path, what, want, k))
        for f, fn in (("flops", P.flops), ("bytes_min", P.bytes_min), ("kv_bytes", P.kv_bytes)):
            if not close(d[f], fn(q)):
                bad.append("{}: {} {}: C++ {!r} != Python {!r}".format(path, want, f, d[f], fn(q)))
        bad += ["{}: {}: {}".format(path, want, x)
                for x in tolerance_mismatches(q["dtype"], d["tolerance"], q["pass"])]
    return bad, len(probs)


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    fb, sweeps = argv[1], argv[2]
    specs = sorted(glob.glob(os.path.join(sweeps, "**", "*.yaml"), recursive=True))
    if not specs:
        print("check_problem_math: no spec under {}; the glob must find the shipped specs".format(sweeps))
        return 1
    bad, n = [], 0
    with tempfile.TemporaryDirectory() as d:
        rare = os.path.join(d, "rare.yaml")
        with open(rare, "w") as f:
            f.write(RARE)
        for path in specs + [rare]:
            b, k = check_spec(fb, path)
            bad += b
            n += k
    for line in bad[:50]:
        print(line)
    print("check_problem_math: {} problems of {} specs (+ the rare-fields spec): {}".format(
        n, len(specs), "{} mismatches".format(len(bad)) if bad else "key, FLOPs and bytes agree"))
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
