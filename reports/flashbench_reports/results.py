"""Reading flashbench results files (Google Benchmark JSON shape plus flashbench fields).

Everything past the top-level shape is optional: older files, peers and hand-made fixtures miss
fields or set them to null, so every accessor here returns None rather than raising.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# The problem key and its parse live in problem.py, the one Python copy of the harness's problem math; re-exported
# here for the modules that read results.
from . import problem as P
from .problem import UserError, normalize_dtype, parse_problem_key, problem_key  # noqa: F401

SCHEMA_VERSION = 1
OK = "ok"
NOT_OK_STATUSES = ("skipped", "incorrect", "crashed", "timeout")
FAILED_STATUSES = ("incorrect", "crashed", "timeout")  # a point that used to work must not end here

_TIME_UNIT_TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def sources_change(a: Optional[str], b: Optional[str]) -> str:
    """'changed', 'same' or 'unknown' (a hash missing): two builds' kernel-source hashes of one variant."""
    if not a or not b:
        return "unknown"
    return "same" if a == b else "changed"


def sources_verdict(variant: str, ref: Optional[Dict[str, str]], cand: Optional[Dict[str, str]]) -> str:
    """sources_change of the variant, given each build's per-variant source hashes (`flashbench list --json`, a
    results file's context.build.variant_sources)."""
    return sources_change((ref or {}).get(variant), (cand or {}).get(variant))


def context_variant_sources(context: Any) -> Dict[str, str]:
    """A results context's per-variant kernel-source hashes ({} in files from before they were recorded)."""
    return _dict(_dict(_dict(context).get("build")).get("variant_sources"))


SOURCES_NOTE = {"changed": "its kernel sources changed",
                "same": "same kernel sources: look at the harness, the build options or the toolkit"}


def _num(x: Any) -> Optional[float]:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        x = float(x)
        return x if math.isfinite(x) else None
    return None


def _dict(x: Any) -> Dict[str, Any]:
    return x if isinstance(x, dict) else {}


@dataclass
class Point:
    """One record, normalised. `raw` keeps the record as read for anything not lifted here."""
    name: str
    variant: str
    config: Dict[str, Any]
    config_str: str
    problem: Dict[str, Any]
    status: str
    reason: str
    median_us: Optional[float]
    tflops: Optional[float]
    samples_us: List[float]
    cv: Optional[float]
    noisy: bool
    raw: Dict[str, Any] = field(repr=False)

    @property
    def ok(self) -> bool:
        return self.status == OK and self.median_us is not None and self.median_us > 0

    @property
    def is_peer(self) -> bool:
        return self.variant.startswith("peer:")

    @property
    def key(self) -> str:
        """The C++ key of the point's problem; a record with neither a problem nor a parseable name keeps its
        name's last part, so that two such points never share a key by accident."""
        return problem_key(self.problem) if self.problem else self.name.split("/")[-1]

    def get(self, *path: str) -> Any:
        """Nested optional field: p.get('counters', 'dram_read_bytes') -> value or None."""
        cur: Any = self.raw
        for k in path:
            if not isinstance(cur, dict):
                return None
            cur = cur.get(k)
        return cur

    def num(self, *path: str) -> Optional[float]:
        return _num(self.get(*path))

    def measured_dram_bytes(self) -> Optional[float]:
        r, w = self.num("counters", "dram_read_bytes"), self.num("counters", "dram_write_bytes")
        if r is None and w is None:
            return None
        return (r or 0.0) + (w or 0.0)

    def flops(self) -> Optional[float]:
        f = self.num("flops")
        if f is None and self.tflops and self.median_us:
            f = self.tflops * 1e12 * self.median_us * 1e-6
        return f


def point_from_record(rec: Dict[str, Any]) -> Point:
    name = str(rec.get("name") or rec.get("run_name") or "?")
    parts = name.split("/")
    variant = rec.get("variant") if isinstance(rec.get("variant"), str) else parts[0]
    problem = _dict(rec.get("problem"))
    if not problem:
        problem = parse_problem_key(parts[-1])
    problem = dict(problem)
    if "dtype" in problem:
        problem["dtype"] = normalize_dtype(problem["dtype"])
    config = _dict(rec.get("config"))
    config_str = rec.get("config_str")
    if not isinstance(config_str, str):
        config_str = parts[1] if len(parts) == 3 else ",".join("{}={}".format(k, v) for k, v in config.items())
    status = rec.get("status")
    if not isinstance(status, str):
        status = "crashed" if rec.get("error_occurred") else OK
    reason = rec.get("reason") or rec.get("error_message") or ""
    median = _num(rec.get("median_us"))
    if median is None and status == OK:
        rt = _num(rec.get("real_time"))
        unit = _TIME_UNIT_TO_US.get(str(rec.get("time_unit", "ns")))
        if rt is not None and unit is not None:
            median = rt * unit
    samples = [float(s) for s in (rec.get("samples_us") or []) if _num(s) is not None] \
        if isinstance(rec.get("samples_us"), list) else []
    tflops = _num(rec.get("tflops"))
    if tflops is None and median and _num(rec.get("flops")):
        tflops = rec["flops"] / (median * 1e-6) / 1e12
    return Point(name=name, variant=str(variant), config=config, config_str=config_str, problem=problem,
                 status=status, reason=str(reason), median_us=median, tflops=tflops, samples_us=samples,
                 cv=_num(rec.get("cv")), noisy=bool(rec.get("noisy")), raw=rec)


@dataclass
class Results:
    path: str
    context: Dict[str, Any]
    points: List[Point]

    @property
    def device(self) -> Dict[str, Any]:
        return _dict(self.context.get("device"))

    @property
    def variant_sources(self) -> Dict[str, str]:
        """Each variant's kernel-source hash in the build that wrote the file ({} in files from before them)."""
        return context_variant_sources(self.context)

    @property
    def ceilings(self) -> Dict[str, Any]:
        return _dict(self.context.get("ceilings"))

    def ceiling(self, name: str) -> Optional[float]:
        v = _num(self.ceilings.get(name))
        return v if v and v > 0 else None

    @property
    def timing_queue(self) -> str:
        """The load the timed loops put on the GPU (timing.queue); results written before it existed: round_trip."""
        return str(_dict(self.context.get("timing_policy")).get("queue") or "round_trip")

    @property
    def device_label(self) -> str:
        d = self.device
        return str(d.get("name") or d.get("slug") or self.context.get("host_name") or os.path.basename(self.path))

    def by_name(self) -> Dict[str, Point]:
        return {p.name: p for p in self.points}


def load(path: str) -> Results:
    """Reads and checks one results file; raises UserError (one line: what, where, what to do)."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UserError("cannot read results file {}: {}; check the path".format(path, e.strerror or e))
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError("{}:{}:{}: malformed JSON ({}); the file is truncated or not a results file, "
                        "re-run the benchmark to regenerate it".format(path, e.lineno, e.colno, e.msg))
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise UserError("{}: not a results file (expected an object with a 'benchmarks' list); "
                        "pass the JSON written by 'flashbench run -o' or scripts/peers.py".format(path))
    context = _dict(doc.get("context"))
    version = context.get("schema_version", doc.get("schema_version"))
    # A file without schema_version is an older or plain Google Benchmark file: read it as version 1.
    if version is not None and version != SCHEMA_VERSION:
        raise UserError("{}: schema_version {!r} is not supported (this flashbench-report reads version {}); "
                        "use a flashbench-report matching the harness that wrote it".format(path, version,
                                                                                          SCHEMA_VERSION))
    points = []
    for i, rec in enumerate(doc["benchmarks"]):
        if not isinstance(rec, dict):
            raise UserError("{}: benchmarks[{}] is not an object; the file is damaged, re-run the "
                            "benchmark".format(path, i))
        if rec.get("run_type") == "aggregate":
            continue  # Google Benchmark repetition aggregates; the per-point record carries the samples
        if (rec.get("repetition_index") or 0) > 0:
            # `peers.py --rounds R`: each point R times, timed in turn with the peers; points are matched by name,
            # so reports read the first round (scripts/peer_table.py pairs all of them)
            continue
        points.append(point_from_record(rec))
    return Results(path=path, context=context, points=points)


def write_text_atomic(path: str, text: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def family_key(p: Dict[str, Any], by_tokens: bool = False) -> str:
    """A problem without its sequence lengths: the curves of a 'TFLOPs vs seqlen' plot.

    by_tokens groups square problems by tokens (batch x seqlen) instead of batch, so that a sweep at fixed tokens
    (B*N = 16384, the anchor shapes, where batch shrinks as N grows) forms one curve."""
    b, sq0 = p.get("batch"), p.get("seqlen_q")
    square = isinstance(b, int) and isinstance(sq0, int) and sq0 == p.get("seqlen_kv") and not _is_decode(p)
    lead = "tok{}".format(b * sq0) if by_tokens and square else "b{}".format(p.get("batch", "?"))
    s = "{} hq{} hkv{} d{} {}{}".format(lead, p.get("heads_q", "?"), p.get("heads_kv", "?"),
                                         p.get("head_dim", "?"), p.get("dtype", "?"),
                                         " causal" if p.get("causal") else "")
    sq, skv = p.get("seqlen_q"), p.get("seqlen_kv")
    if sq is not None and sq != skv:
        s += " sq{}".format(sq) if _is_decode(p) else " sq≠skv"
    # What else sets problems of one shape apart (problem_key's suffixes): a paged cache, per-entry lengths (as a
    # mark: the lengths move with seqlen_kv along a curve), layout and scale. Without it a paged and a contiguous
    # decode at one seqlen were one point of one curve.
    if p.get("quant") == "block_hadamard":  # e4m3 inputs rotated before quantization: other codes, same kernel
        s += " hadamard"
    if p.get("layout") not in (None, "bshd"):
        s += " " + str(p["layout"])
    if _num(p.get("scale")):
        s += " scale{:g}".format(p["scale"])
    if p.get("kv_lens"):
        s += " kv_lens"
    if p.get("page_size"):
        s += " page{}".format(p["page_size"])
    # The backward's curves apart from the forward's of the same shape (2.5x the FLOPs, other kernels).
    if P.normalize_pass(p.get("pass")) == "bwd":
        s += " bwd"
    return s


def _is_decode(p: Dict[str, Any]) -> bool:
    sq = p.get("seqlen_q")
    return isinstance(sq, int) and sq <= 16


def seqlen_of(p: Dict[str, Any]) -> Optional[int]:
    v = p.get("seqlen_kv", p.get("seqlen_q"))
    return v if isinstance(v, int) else None


def best_per_variant(points: List[Point]) -> Dict[tuple, Point]:
    """(variant, problem key) -> the ok point with the highest TFLOPs (lowest time) over configs."""
    best: Dict[tuple, Point] = {}
    for p in points:
        if not p.ok:
            continue
        k = (p.variant, p.key)
        cur = best.get(k)
        if cur is None or p.median_us < cur.median_us:
            best[k] = p
    return best
