"""Problem math, the one Python copy of flashbench/problem.hpp: the problem key, FLOPs, minimum bytes and the peers'
verification tolerances. scripts/peers.py and the reports both use it; a CTest (reports/tests/check_problem_math.py)
compares the key, FLOPs and bytes with the C++ harness's on every problem of every shipped spec.

Standard library only: scripts/peers.py imports it on GPU runners where nothing is installed.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List, Optional

DTYPES = ("fp32", "fp16", "bf16", "e4m3")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "e4m3": 1}
OUT_DTYPE = {"e4m3": "bf16"}  # O's dtype where it is not the inputs' (problem.hpp, out_dtype)
FP8_SCALE_BLOCK = 128  # tokens per Q/K descale (problem.hpp, kFp8ScaleBlock)
QUANTS = ("block", "block_hadamard")  # problem.hpp, Quant: e4m3 only; a problem without "quant" is "block"
PASSES = ("fwd", "bwd")  # problem.hpp, Pass; a problem without "pass" (older records) is a forward
BWD_FLOPS_FACTOR = 2.5  # problem.hpp, kBwdFlopsFactor: five GEMMs against the forward's two
_PASS_ALIASES = {"forward": "fwd", "backward": "bwd"}

# The peers' check (scripts/peers.py): atol + rtol * |ref| per input dtype. fp32 allows for TF32 inside a torch
# backend, and fp16/bf16 for other implementations' rounding, so these are at least the harness's own bounds
# (verify.cpp, tolerance_for), never stricter. e4m3 is the harness's bound exactly: plus E4M3_P_ROUND times the
# reference over |V| per element, and the norm bound E4M3_REL_L2.
TOLERANCE = {"fp32": (2e-3, 2e-3), "fp16": (1e-2, 1e-2), "bf16": (2e-2, 2e-2), "e4m3": (1e-2, 2e-2)}
E4M3_REL_L2 = 5e-2
E4M3_P_ROUND = 0.075

_DTYPE_ALIASES = {"f32": "fp32", "float32": "fp32", "f16": "fp16", "float16": "fp16", "half": "fp16",
                  "bfloat16": "bf16", "fp8": "e4m3", "float8_e4m3fn": "e4m3"}


class UserError(Exception):
    """A problem with the user's input; command lines print it as one line and exit 2."""


def normalize_dtype(dt: Any) -> Optional[str]:
    """The harness's dtype name (problem.cpp, parse_dtype's aliases); None for a non-string."""
    if not isinstance(dt, str):
        return None
    return _DTYPE_ALIASES.get(dt, dt)


def normalize_pass(ps: Any) -> Optional[str]:
    """The harness's pass name (problem.cpp, parse_pass's aliases); "fwd" for none (records before the backward)."""
    if ps is None:
        return "fwd"
    if not isinstance(ps, str):
        return None
    return _PASS_ALIASES.get(ps, ps)


def normalize_problem(p: dict) -> dict:
    """A problem object as written by `flashbench plan` or a results record, with the harness's defaults filled in
    and checked; raises UserError (one line) for what the harness would refuse."""
    q = {"batch": 1, "heads_q": 1, "heads_kv": None, "seqlen_q": None, "seqlen_kv": None, "head_dim": 64,
         "causal": False, "dtype": "bf16", "layout": "bshd", "scale": 0.0, "pass": "fwd"}
    q.update({k: v for k, v in p.items() if v is not None})
    q["kv_lens"] = list(q.get("kv_lens") or [])
    q["page_size"] = int(q.get("page_size") or 0)
    q["heads_kv"] = q["heads_kv"] or q["heads_q"]
    q["seqlen_kv"] = q["seqlen_kv"] or q["seqlen_q"]
    q["dtype"] = normalize_dtype(q["dtype"])
    q["pass"] = normalize_pass(q["pass"])
    for k in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim"):
        if not isinstance(q[k], int) or isinstance(q[k], bool) or q[k] <= 0:
            raise UserError("problem {}: {} must be a positive integer".format(json.dumps(p), k))
    if q["heads_q"] % q["heads_kv"]:
        raise UserError("problem {}: heads_q must be a multiple of heads_kv".format(json.dumps(p)))
    if q["dtype"] not in DTYPE_BYTES:
        raise UserError("problem {}: dtype must be fp32, fp16, bf16 or e4m3".format(json.dumps(p)))
    if q["kv_lens"] and len(q["kv_lens"]) != q["batch"]:
        raise UserError("problem {}: kv_lens needs one length per batch entry".format(json.dumps(p)))
    q["quant"] = q.get("quant") or "block"
    if q["quant"] not in QUANTS:
        raise UserError("problem {}: quant must be block or block_hadamard".format(json.dumps(p)))
    if q["quant"] != "block" and q["dtype"] != "e4m3":
        raise UserError("problem {}: quant {} quantizes e4m3 inputs; use dtype e4m3".format(json.dumps(p),
                                                                                            q["quant"]))
    if q["pass"] not in PASSES:
        raise UserError("problem {}: pass must be fwd or bwd".format(json.dumps(p)))
    if q["pass"] == "bwd" and (q["dtype"] == "e4m3" or q["kv_lens"] or q["page_size"] or q["layout"] != "bshd"):
        raise UserError("problem {}: the backward (pass: bwd) takes dense bshd problems of bf16, fp16 or fp32"
                        .format(json.dumps(p)))
    return q


def unmasked_pairs(p: dict, skv: Optional[int] = None) -> int:
    """(query, key) pairs that are not masked, per (batch, head), for an entry of skv keys (default seqlen_kv);
    bottom-right causal alignment: query i sees key j iff j <= i + skv - sq."""
    sq = p["seqlen_q"]
    skv = p["seqlen_kv"] if skv is None else skv
    if not p["causal"]:
        return sq * skv
    off = skv - sq  # row i sees keys 0 .. i + off, clipped to [0, skv]
    # rows with i + off + 1 in [1, skv] contribute i + off + 1; rows beyond contribute skv; rows before, 0
    first = max(0, -off)               # first row that sees at least one key
    full = max(0, min(sq, skv - off))  # rows i < full see fewer than all keys (i + off + 1 <= skv)
    partial = 0
    if full > first:
        a, b = first + off + 1, full - 1 + off + 1
        partial = (a + b) * (full - first) // 2
    return partial + (sq - max(full, first)) * skv


def unmasked_pairs_total(p: dict) -> int:
    """unmasked_pairs summed over the batch, each entry with its own length (kv_lens) when given."""
    lens = p.get("kv_lens") or []
    if not lens:
        return p["batch"] * unmasked_pairs(p)
    return sum(unmasked_pairs(p, n) for n in lens)


def flops(p: dict) -> float:
    """FlashAttention's convention: 4 * Hq * d * (unmasked pairs over the batch), the forward's two GEMMs; the
    backward's five are BWD_FLOPS_FACTOR times that."""
    fwd = 4.0 * p["heads_q"] * p["head_dim"] * unmasked_pairs_total(p)
    return BWD_FLOPS_FACTOR * fwd if normalize_pass(p.get("pass")) == "bwd" else fwd


def kv_bytes(p: dict) -> float:
    """K and V bytes read: each entry's own length (kv_lens) when given."""
    keys = sum(p["kv_lens"]) if p.get("kv_lens") else p["batch"] * p["seqlen_kv"]
    return float(2 * DTYPE_BYTES[p["dtype"]] * keys * p["heads_kv"] * p["head_dim"])


def bytes_min(p: dict) -> float:
    """The fewest bytes any implementation moves. Forward: Q read, K/V read once, O written (out dtype), LSE (fp32).
    Backward: Q, K, V, O, dO and LSE (fp32) read once, dQ, dK, dV written once."""
    q = p["batch"] * p["heads_q"] * p["seqlen_q"] * p["head_dim"]
    lse = 4 * p["batch"] * p["heads_q"] * p["seqlen_q"]
    if normalize_pass(p.get("pass")) == "bwd":
        return float(4 * DTYPE_BYTES[p["dtype"]] * q + 2 * kv_bytes(p) + lse)
    el = DTYPE_BYTES[p["dtype"]] + DTYPE_BYTES[OUT_DTYPE.get(p["dtype"], p["dtype"])]
    return float(el * q + kv_bytes(p) + lse)


def _fnv1a_kv_lens(lens: List[int]) -> int:
    h = 0xcbf29ce484222325
    for x in lens:
        h = ((h ^ (x & 0xffffffffffffffff)) * 0x100000001b3) & 0xffffffffffffffff
    return h


def problem_key(p: Dict[str, Any]) -> str:
    """The C++ key(AttentionProblem): 'b2_hq16_hkv4_sq512_skv1024_d128_causal_bf16', then quant ('_hadamard' right
    after the dtype), layout, scale, kv_lens and page_size where not the default, '_bwd' last for the backward. A field a record lacks reads '?' ('?' alone for no
    problem at all)."""
    if not p:
        return "?"
    s = "b{}_hq{}_hkv{}_sq{}_skv{}_d{}".format(p.get("batch", "?"), p.get("heads_q", "?"), p.get("heads_kv", "?"),
                                            p.get("seqlen_q", "?"), p.get("seqlen_kv", "?"), p.get("head_dim", "?"))
    if p.get("causal"):
        s += "_causal"
    s += "_" + str(normalize_dtype(p.get("dtype")) or "?")
    if p.get("quant") == "block_hadamard":
        s += "_hadamard"
    if p.get("layout") not in (None, "bshd"):
        s += "_" + str(p["layout"])
    scale = p.get("scale")
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and scale != 0 and math.isfinite(scale):
        s += "_scale{:g}".format(scale)  # std::ostream's default: %g, 6 significant digits
    lens = p.get("kv_lens") or []
    if lens:  # the lengths up to 8 entries, else their sum and the low 32 bits of an FNV-1a hash
        if len(lens) <= 8:
            s += "_kvl" + "-".join(str(x) for x in lens)
        else:
            s += "_kvl{}x{:08x}".format(sum(lens), _fnv1a_kv_lens(lens) & 0xffffffff)
    if p.get("page_size"):
        s += "_page{}".format(p["page_size"])
    ps = normalize_pass(p.get("pass"))
    if ps != "fwd":
        s += "_" + str(ps or "?")
    return s


_KEY_RE = re.compile(r"^b(\d+)_hq(\d+)_hkv(\d+)_sq(\d+)_skv(\d+)_d(\d+)(_causal)?_(fp32|f32|fp16|f16|bf16|e4m3)"
                     r"(?:_(hadamard))?(?:_(bhsd))?(?:_scale([0-9.eE+-]+))?(?:_kvl([0-9-]+|\d+x[0-9a-f]{8}))?(?:_page(\d+))?"
                     r"(?:_(bwd))?$")


def parse_problem_key(key: str) -> Dict[str, Any]:
    """Problem fields from a key, such that problem_key gives the key back; {} if it is not one, or if it names a
    kv_lens of more than 8 entries (only their sum and hash are in the key)."""
    m = _KEY_RE.match(key or "")
    if not m:
        return {}
    b, hq, hkv, sq, skv, d, causal, dt, had, layout, scale, kvl, page, ps = m.groups()
    p = {"batch": int(b), "heads_q": int(hq), "heads_kv": int(hkv), "seqlen_q": int(sq), "seqlen_kv": int(skv),
         "head_dim": int(d), "causal": bool(causal), "dtype": normalize_dtype(dt)}
    if had:
        p["quant"] = "block_hadamard"
    if layout:
        p["layout"] = layout
    if scale:
        try:
            p["scale"] = float(scale)
        except ValueError:
            return {}
    if kvl:
        if "x" in kvl:
            return {}  # the lengths themselves are not in the key
        p["kv_lens"] = [int(x) for x in kvl.split("-")]
    if page:
        p["page_size"] = int(page)
    if ps:
        p["pass"] = ps
    return p
