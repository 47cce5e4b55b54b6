#!/usr/bin/env python3
"""peers.py: time torch SDPA (flash, cuDNN, efficient backends) and FlexAttention on flashbench problems and
write the records in flashbench's results-file schema (reports/SCHEMA.md), so reports put peers next to our
variants.

  python scripts/peers.py --problems plan.json -o peers.json [--ceilings] [--peers torch_flash,flex]
  python scripts/peers.py --problems plan.json -o ab.json --peers torch_cudnn --ours fa3_pipelined \
      --ours-best results.json --rounds 3

With --ours, a catalog variant is timed here too (through libflashbench_capi.so, harness/capi), by the same timer,
in the same process and interleaved with the peers: each problem's peers and the variant in turn, --rounds times,
the order reversed every other round. A ratio of such records (scripts/peer_table.py ab.json) compares code under
the same power and thermal state, where a `flashbench run` and a peers.py run minutes apart may not (an H100 at its
700 W cap moves between 1980 and ~1700 MHz over seconds). --ours-best takes each problem's config from an earlier
sweep's results, so that the config is chosen on other samples than the ones compared; with --ours-top K its K
fastest (by fastest sample) are all timed, and scripts/peer_table.py picks one by its ratio in the first round and
reports its ratio over the later rounds.

plan.json is {"problems": [...], "spec": {...}, "timing_policy": {...}} as written by `flashbench plan SPEC.yaml`.
Measurement mirrors the harness, with the plan's timing policy: warm-up, then per sample an L2 flush (outside the
timed region) and a CUDA-event-timed call; the harness's stopping rule (noise target after min samples and min GPU
time, or the timeout); samples under 75% of the maximum clock dropped. Records carry the timed loop's busy
fraction and mean power, as the harness's do, so a ratio can be checked for equal load.
Each peer output is checked against a float64 reference before it is timed; a peer that fails is
`incorrect`, a combination a backend cannot run is `skipped` with the reason.

Causal masks are aligned bottom-right as in FlashAttention (query i sees key j iff j <= i + Skv - Sq).
torch's is_causal is top-left aligned, so it is used only when Sq == Skv; otherwise SDPA gets
torch's causal_lower_right bias and FlexAttention a bottom-right mask_mod.

Only the standard library is imported before torch, so the script runs where flashbench_reports is not
installed. Without torch or a CUDA device it says so on one line and exits 0 without writing a file.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
import warnings

SCHEMA_VERSION = 1
PEERS = ("torch_flash", "torch_cudnn", "torch_efficient", "flex", "torch_fp8")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "e4m3": 1}
OUT_DTYPE = {"e4m3": "bf16"}  # O's dtype where it is not the inputs' (flashbench/problem.hpp, out_dtype)
# atol + rtol * |ref|, per input dtype; fp32 allows for TF32 inside a backend. e4m3 as flashbench's verify.cpp
# (harness/src/verify.cpp, tolerance_for): plus E4M3_P_ROUND times the reference over |V| per element, and the norm
# bound E4M3_REL_L2.
TOLERANCE = {"fp32": (2e-3, 2e-3), "fp16": (1e-2, 1e-2), "bf16": (2e-2, 2e-2), "e4m3": (1e-2, 2e-2)}
E4M3_REL_L2 = 5e-2
E4M3_P_ROUND = 0.075
FP8_SCALE_BLOCK = 128  # tokens per Q/K descale (flashbench/problem.hpp, kFp8ScaleBlock)


class UserError(Exception):
    pass


# ---------------------------------------------------------------- problem arithmetic (no torch needed)

def normalize_problem(p: dict) -> dict:
    q = {"batch": 1, "heads_q": 1, "heads_kv": None, "seqlen_q": None, "seqlen_kv": None, "head_dim": 64,
         "causal": False, "dtype": "bf16", "layout": "bshd", "scale": 0.0}
    q.update({k: v for k, v in p.items() if v is not None})
    q["kv_lens"] = list(q.get("kv_lens") or [])
    q["page_size"] = int(q.get("page_size") or 0)
    q["heads_kv"] = q["heads_kv"] or q["heads_q"]
    q["seqlen_kv"] = q["seqlen_kv"] or q["seqlen_q"]
    q["dtype"] = {"f32": "fp32", "f16": "fp16"}.get(q["dtype"], q["dtype"])
    for k in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim"):
        if not isinstance(q[k], int) or isinstance(q[k], bool) or q[k] <= 0:
            raise UserError("problem {}: {} must be a positive integer".format(json.dumps(p), k))
    if q["heads_q"] % q["heads_kv"]:
        raise UserError("problem {}: heads_q must be a multiple of heads_kv".format(json.dumps(p)))
    if q["dtype"] not in DTYPE_BYTES:
        raise UserError("problem {}: dtype must be fp32, fp16, bf16 or e4m3".format(json.dumps(p)))
    return q


def unmasked_pairs(p: dict) -> int:
    """(query, key) pairs that are not masked, per (batch, head), bottom-right causal alignment."""
    sq, skv = p["seqlen_q"], p["seqlen_kv"]
    if not p["causal"]:
        return sq * skv
    off = skv - sq  # row i sees keys 0 .. i + off, clipped to [0, skv]
    # rows with i + off + 1 in [1, skv] contribute i + off + 1; rows beyond contribute skv; rows before, 0
    first = max(0, -off)              # first row that sees at least one key
    full = max(0, min(sq, skv - off))  # rows i < full see fewer than all keys (i + off + 1 <= skv)
    partial = 0
    if full > first:
        a, b = first + off + 1, full - 1 + off + 1
        partial = (a + b) * (full - first) // 2
    return partial + (sq - max(full, first)) * skv


def flops(p: dict) -> float:
    return 4.0 * p["batch"] * p["heads_q"] * p["head_dim"] * unmasked_pairs(p)


def kv_bytes(p: dict) -> float:
    """K and V bytes read: each entry's own length (kv_lens) when given."""
    keys = sum(p["kv_lens"]) if p.get("kv_lens") else p["batch"] * p["seqlen_kv"]
    return float(2 * DTYPE_BYTES[p["dtype"]] * keys * p["heads_kv"] * p["head_dim"])


def bytes_min(p: dict) -> float:
    el = DTYPE_BYTES[p["dtype"]] + DTYPE_BYTES[OUT_DTYPE.get(p["dtype"], p["dtype"])]  # Q read, O written
    q = p["batch"] * p["heads_q"] * p["seqlen_q"] * p["head_dim"]
    return float(el * q + kv_bytes(p) + 4 * p["batch"] * p["heads_q"] * p["seqlen_q"])


def problem_key(p: dict) -> str:
    s = "b{batch}_hq{heads_q}_hkv{heads_kv}_sq{seqlen_q}_skv{seqlen_kv}_d{head_dim}".format(**p)
    s += ("_causal" if p["causal"] else "") + "_" + p["dtype"]
    if p.get("layout") not in (None, "bshd"):
        s += "_" + p["layout"]
    if p.get("scale"):
        s += "_scale{:g}".format(p["scale"])
    lens = p.get("kv_lens") or []
    if lens:  # as flashbench's key(): the lengths up to 8 entries, else their sum and an FNV-1a hash
        if len(lens) <= 8:
            s += "_kvl" + "-".join(str(x) for x in lens)
        else:
            h = 0xcbf29ce484222325
            for x in lens:
                h = ((h ^ (x & 0xffffffffffffffff)) * 0x100000001b3) & 0xffffffffffffffff
            s += "_kvl{}x{:08x}".format(sum(lens), h & 0xffffffff)
    if p.get("page_size"):
        s += "_page{}".format(p["page_size"])
    return s


def record(peer: str, p: dict, status: str, reason: str = "", timing: dict = None, check: dict = None,
           seed: int = 0, extra: dict = None, config_str: str = "", rep: tuple = (0, 1)) -> dict:
    """A peer's record ("peer:<name>/<problem>"), or with config_str a catalog variant's through --ours, named as
    flashbench names it ("<variant>/<config>/<problem>"). rep: (repetition_index, repetitions) of --rounds."""
    variant = peer if config_str else "peer:" + peer
    name = "/".join(x for x in (variant, config_str, problem_key(p)) if x)
    config = dict(kv.split("=", 1) for kv in config_str.split(",")) if config_str else {}
    rec = {"name": name, "run_name": name, "run_type": "iteration", "repetitions": rep[1], "repetition_index": rep[0],
           "threads": 1, "time_unit": "us", "variant": variant, "config": config, "config_str": config_str,
           "problem": {k: v for k, v in p.items() if v or k not in ("kv_lens", "page_size")},
           "status": status, "reason": reason, "flops": flops(p), "bytes_min": bytes_min(p), "bytes_model": None,
           "seed": seed, "counters": None, "counters_reason": "peers.py does not collect counters"}
    rec.update(check or {})
    rec.update(extra or {})
    if status == "ok" and timing:
        med = timing["median_us"]
        rec.update({"iterations": len(timing["samples_us"]), "real_time": med, "cpu_time": med,
                    "tflops": flops(p) / (med * 1e-6) / 1e12, "kv_bytes": kv_bytes(p),
                    "kv_gbps": kv_bytes(p) / (med * 1e-6) / 1e9,
                    "bytes_min_gbps": bytes_min(p) / (med * 1e-6) / 1e9})
        rec.update(timing)
        if len(rec["samples_us"]) > 1000:  # keep the file small: evenly spaced subsample
            s = rec["samples_us"]
            rec["samples_us"] = [s[int(i * len(s) / 1000)] for i in range(1000)]
    else:
        rec.update({"error_occurred": True, "error_message": reason or status, "iterations": 0, "real_time": 0,
                    "cpu_time": 0, "tflops": None, "median_us": None, "samples_us": []})
    return rec


def summarize(samples):
    s = sorted(samples)
    n = len(s)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    mean = sum(s) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in s) / (n - 1)) if n > 1 else 0.0
    return {"median_us": med, "min_us": s[0], "max_us": s[-1], "mean_us": mean, "cv": sd / mean if mean else None}


def write_atomic(path: str, doc: dict) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-peers-")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def append_partial(f, rec: dict) -> None:
    """One record, one line, flushed to the disk: what a killed run leaves (see main)."""
    f.write(json.dumps(rec) + "\n")
    f.flush()
    os.fsync(f.fileno())


def load_plan(path: str) -> list:
    try:
        with open(path) as f:
            plan = json.load(f)
    except OSError as e:
        raise UserError("cannot read {}: {}; write it with 'flashbench plan SPEC.yaml > plan.json'".format(path, e.strerror))
    except json.JSONDecodeError as e:
        raise UserError("{}:{}:{}: malformed JSON ({}); regenerate it with 'flashbench plan SPEC.yaml > plan.json'"
                        .format(path, e.lineno, e.colno, e.msg))
    probs = plan.get("problems") if isinstance(plan, dict) else None
    if not isinstance(probs, list) or not all(isinstance(p, dict) for p in probs):
        raise UserError("{}: expected {{\"problems\": [problem objects]}}; regenerate it with "
                        "'flashbench plan SPEC.yaml > plan.json'".format(path))
    out, seen = [], set()
    for p in probs:
        q = normalize_problem(p)
        if problem_key(q) not in seen:
            seen.add(problem_key(q))
            out.append(q)
    spec = plan.get("spec") if isinstance(plan.get("spec"), dict) else None
    timing = plan.get("timing_policy") if isinstance(plan.get("timing_policy"), dict) else {}
    return out, spec, timing


# argparse name -> (the plan's timing_policy field, the harness's default in timing.hpp; warm-up is longer here
# because torch's first calls of a backend still select and cache kernels)
TIMING_FIELDS = {"warmup": ("warmup_runs", 10), "min_samples": ("min_samples", 10), "max_samples": ("max_samples", 100000),
                 "min_time": ("min_time_s", 0.5), "timeout": ("timeout_s", 15.0), "max_noise": ("max_noise", 0.005),
                 "settle": ("settle_s", 2.0), "cold": ("cold", True), "flush": ("flush", "read"),
                 "throttle_fraction": ("throttle_fraction", 0.75), "queue": ("queue", "round_trip")}


def resolve_timing(args, plan_timing: dict) -> None:
    """Fills each timing option not given on the command line from the plan's timing_policy, else the default."""
    warmup_given = getattr(args, "warmup", None) is not None
    for name, (field, default) in TIMING_FIELDS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, type(default)(plan_timing.get(field, default)))
    if not warmup_given:
        args.warmup = max(args.warmup, TIMING_FIELDS["warmup"][1])


# ---------------------------------------------------------------- torch side

class Peer:
    """One peer bound to a problem: build(q, k, v) -> fn() returning O in [B, Hq, Sq, D]."""
    config = ""    # a catalog variant's config string (Ours); peers have none
    poison = None  # Ours: overwrites the outputs fn() writes in place, before a graph replay is compared

    def close(self):
        pass

    def __init__(self, torch, name: str, p: dict):
        self.torch, self.name, self.p = torch, name, p
        self.extra = {}

    def skip_reason(self):
        p = self.p
        if p.get("kv_lens"):
            return "per-entry KV lengths (kv_lens) are not modelled for torch peers (SDPA has no cache_seqlens)"
        if p.get("page_size"):
            return "paged KV caches are not modelled for torch peers (SDPA reads contiguous K/V)"
        if self.name == "torch_flash" and p["dtype"] == "fp32":
            return "torch flash backend needs fp16 or bf16 inputs"
        if self.name == "torch_cudnn" and p["dtype"] == "fp32":
            return "torch cuDNN backend needs fp16 or bf16 inputs"
        if (self.name == "torch_fp8") != (p["dtype"] == "e4m3"):
            return "torch_fp8 takes e4m3 problems only" if self.name == "torch_fp8" else \
                "e4m3 inputs with per-block descales: torch's peer for them is torch_fp8"
        return None

    def build(self, q, k, v):
        torch, p = self.torch, self.p
        scale = p["scale"] or None
        gqa = p["heads_q"] != p["heads_kv"]
        if self.name == "torch_fp8":
            return self.build_fp8(q, k, v, scale)
        if self.name == "flex":
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            # A fresh compile per problem: past dynamo's recompile limit (8 shapes) torch silently falls back
            # to eager flex_attention, which is tens of times slower and would misrepresent the peer.
            torch._dynamo.reset()
            fn = torch.compile(flex_attention, dynamic=False)
            block_mask = None
            if p["causal"]:
                off = p["seqlen_kv"] - p["seqlen_q"]

                def bottom_right(b, h, q_idx, kv_idx):
                    return kv_idx <= q_idx + off
                block_mask = create_block_mask(bottom_right, B=None, H=None, Q_LEN=p["seqlen_q"],
                                               KV_LEN=p["seqlen_kv"], device=q.device)
            kwargs = {"block_mask": block_mask, "scale": scale}
            if gqa:
                kwargs["enable_gqa"] = True
            self.extra["peer_causal"] = "block_mask_bottom_right" if p["causal"] else "none"
            return lambda: fn(q, k, v, **kwargs)

        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = {"torch_flash": SDPBackend.FLASH_ATTENTION, "torch_cudnn": SDPBackend.CUDNN_ATTENTION,
                   "torch_efficient": SDPBackend.EFFICIENT_ATTENTION}[self.name]
        F = torch.nn.functional
        kwargs = {"scale": scale}
        if gqa:
            kwargs["enable_gqa"] = True
        if p["causal"] and p["seqlen_q"] == p["seqlen_kv"]:
            kwargs["is_causal"] = True
            self.extra["peer_causal"] = "is_causal"
        elif p["causal"]:
            from torch.nn.attention.bias import causal_lower_right
            kwargs["attn_mask"] = causal_lower_right(p["seqlen_q"], p["seqlen_kv"])
            self.extra["peer_causal"] = "causal_lower_right"
        else:
            self.extra["peer_causal"] = "none"

        def call():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
        return call


    def build_fp8(self, q, k, v, scale):
        """torch's FP8 SDPA (torch.nn.attention.experimental._scaled_dot_product_attention_quantized) on the same
        e4m3 codes as ours. Its descales are per (batch, kv head) (FA3's backend) or per tensor (cuDNN's, in later
        torch), not per 128-token block: each block's descale is replaced by its head's largest (per head) or the
        tensor's (per tensor), and the check compares with the reference of those values (self.ref_values)."""
        torch, p = self.torch, self.p
        import torch.nn.attention.experimental._scaled_dot_product_attention_quantized as m
        if not hasattr(m.DescaleType, "PER_TENSOR"):
            # torch 2.11: FA3's backend only, which needs the flash_attn_3 package; its error names what is missing
            try:
                torch.nn.attention.activate_flash_attention_impl("FA3")
            except Exception as e:
                raise ValueError("torch_fp8 (torch {}): per-head FP8 SDPA needs the FA3 backend, and "
                                 "activate_flash_attention_impl('FA3') failed: {}".format(torch.__version__,
                                                                                        first_line(e)))
        qd, kd, vd = self.inputs.descales
        if hasattr(m.DescaleType, "PER_TENSOR"):
            kind = m.DescaleType.PER_TENSOR
            ds = [d.amax().reshape(1, 1, 1, 1) for d in (qd, kd, vd)]
            per = [d.reshape(1, 1, 1) for d in ds]
            self.extra["peer_descale"] = "per_tensor"
        else:
            kind = m.DescaleType.PER_HEAD
            # q_descale is (batch, kv heads) too: one per GQA group, as torch documents
            grp = p["heads_q"] // p["heads_kv"]
            qh = qd.amax(dim=2).reshape(p["batch"], p["heads_kv"], grp).amax(dim=2)
            ds = [qh.contiguous(), kd.amax(dim=2).contiguous(), vd.contiguous()]
            per = [qh.repeat_interleave(grp, dim=1)[:, :, None], ds[1][:, :, None], ds[2][:, :, None]]
            self.extra["peer_descale"] = "per_head"
        self.ref_values = tuple(c.float() * d[:, :, :, None] for c, d in zip((q, k, v), per))
        kwargs = {"is_causal": bool(p["causal"]), "scale": scale, "q_descale": ds[0], "k_descale": ds[1],
                  "v_descale": ds[2], "q_descale_type": kind, "k_descale_type": kind, "v_descale_type": kind}
        if p["causal"] and p["seqlen_q"] != p["seqlen_kv"]:
            raise ValueError("torch_fp8: is_causal is top-left aligned; seqlen_q != seqlen_kv is not modelled")
        self.extra["peer_causal"] = "is_causal" if p["causal"] else "none"
        f = m._scaled_dot_product_attention_quantized
        return lambda: f(q, k, v, **kwargs)


class CapiLib:
    """libflashbench_capi.so (harness/capi, flashbench/capi.h) through ctypes: a catalog variant launched on torch's
    stream over torch's tensors, so that this script times it with the peers' timer, in the same process."""

    def __init__(self, path: str):
        import ctypes
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            raise UserError("--lib {}: cannot load it ({}); build it with 'cmake --build build --target "
                            "flashbench_capi'".format(path, str(e).splitlines()[0]))
        self.path = os.path.abspath(path)
        P = ctypes.c_void_p
        lib.fb_capi_create.restype, lib.fb_capi_create.argtypes = P, [ctypes.c_char_p] * 3
        lib.fb_capi_config_string.restype, lib.fb_capi_config_string.argtypes = ctypes.c_char_p, [P]
        lib.fb_capi_launch.restype, lib.fb_capi_launch.argtypes = ctypes.c_int, [P] * 7
        lib.fb_capi_set_descales.restype, lib.fb_capi_set_descales.argtypes = ctypes.c_int, [P] * 4
        lib.fb_capi_destroy.restype, lib.fb_capi_destroy.argtypes = None, [P]
        lib.fb_capi_last_error.restype, lib.fb_capi_last_error.argtypes = ctypes.c_char_p, []
        self.lib = lib

    def error(self) -> str:
        return self.lib.fb_capi_last_error().decode()


class Ours(Peer):
    """A catalog variant at one config (--ours), bound to a problem. Its output and LSE are poisoned (NaN) before the
    verified call and before a graph replay is compared with it."""

    def __init__(self, torch, lib: CapiLib, variant: str, config: str, p: dict):
        super().__init__(torch, variant, p)
        self.lib, self.config, self.handle, self.outputs = lib, config, None, ()

    def skip_reason(self):
        if self.config is None:
            return "no config of {} for this problem in --ours-best's results".format(self.name)
        if self.p.get("kv_lens") or self.p.get("page_size"):
            return "per-entry KV lengths and paged caches are not modelled by peers.py's inputs"
        return None

    def build(self, q, k, v):
        torch, p = self.torch, self.p
        problem = json.dumps({f: p[f] for f in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim",
                                                 "causal", "dtype", "layout", "scale")})
        h = self.lib.lib.fb_capi_create(self.name.encode(), self.config.encode(), problem.encode())
        if not h:
            raise ValueError(self.lib.error())
        self.handle = h
        self.config = self.lib.lib.fb_capi_config_string(h).decode()
        if p["dtype"] == "e4m3":
            ds = self.inputs.descales  # kept alive by self.inputs while the launcher is
            if self.lib.lib.fb_capi_set_descales(h, *(d.data_ptr() for d in ds)) != 0:
                raise ValueError(self.lib.error())
        o, lse = self.outputs = self.make_outputs(q)
        self.poison()
        launch, lib, ptrs = self.lib.lib.fb_capi_launch, self.lib, (q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                                                 o.data_ptr(), lse.data_ptr())

        def call():
            if launch(h, *ptrs, torch.cuda.current_stream().cuda_stream) != 0:
                raise RuntimeError(lib.error())
            return o
        return call

    def make_outputs(self, q):
        """O (as SDPA's [B, Hq, Sq, D] view of the problem's layout) and LSE [B, Hq, Sq], from torch's allocator."""
        torch, p = self.torch, self.p
        B, Hq, Sq, D = p["batch"], p["heads_q"], p["seqlen_q"], p["head_dim"]
        dt = torch.bfloat16 if p["dtype"] == "e4m3" else q.dtype
        o = (torch.empty(B, Sq, Hq, D, dtype=dt, device=q.device).transpose(1, 2) if p["layout"] == "bshd"
             else torch.empty(B, Hq, Sq, D, dtype=dt, device=q.device))
        return o, torch.empty(B, Hq, Sq, dtype=torch.float32, device=q.device)

    def poison(self):
        for t in self.outputs:
            t.fill_(float("nan"))

    def close(self):
        if self.handle:
            self.torch.cuda.synchronize()
            self.lib.lib.fb_capi_destroy(self.handle)
            self.handle = None


def best_configs(path: str, variant: str, top: int = 1) -> dict:
    """problem_key -> the config strings of VARIANT's `top` fastest verified points in a `flashbench run` results
    file, fastest first, ranked by the fastest sample (min_us), not the median: under a power cap a point's median
    is set by the clock phase it drew (c157, H100 d128 N4096: the config fastest by median had run at 1980 MHz while
    four others ran at ~1700 MHz; by min_us another one was 5% faster), while the fastest sample was taken near the
    highest clock by every point that saw one. Time the `top` candidates interleaved (--interleave sample) to pick
    among them on equal terms."""
    try:
        with open(path) as f:
            records = json.load(f)["benchmarks"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UserError("--ours-best {}: cannot read a flashbench results file ({})".format(path, e))
    points = {}
    for r in records:
        if r.get("status") != "ok" or not r.get("tflops") or r.get("variant") != variant:
            continue
        us = r.get("min_us") or r.get("median_us") or r["flops"] / (r["tflops"] * 1e6)
        points.setdefault(problem_key(normalize_problem(r["problem"])), []).append((us, r["config_str"]))
    if not points:
        raise UserError("--ours-best {}: no verified point of {} in it".format(path, variant))
    return {k: [c for _, c in sorted(v)[:top]] for k, v in points.items()}


class Fp8Inputs(tuple):
    """e4m3 inputs: the (q, k, v) codes as SDPA's [B, H, S, D] views, with .descales (float32: Q [B, Hq, ceil(Sq /
    128)], K [B, Hkv, ceil(Skv / 128)], V [B, Hkv]) and .values (the dequantized float32 q, k, v, for the check)."""


def quantize_e4m3(torch, x, block: int):
    """x float32 [B, H, S, D] -> (codes [B, H, S, D] float8_e4m3fn, descale [B, H, ceil(S / block)]): per (batch,
    head, block of tokens) amax / 448, as flashbench's fill_quantized_e4m3."""
    B, H, S, D = x.shape
    nb = (S + block - 1) // block
    pad = torch.nn.functional.pad(x, (0, 0, 0, nb * block - S)).reshape(B, H, nb, block * D)
    amax = pad.abs().amax(dim=3)
    ds = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    codes = (pad / ds[..., None]).clamp(-448.0, 448.0).reshape(B, H, nb * block, D)[:, :, :S].to(torch.float8_e4m3fn)
    return codes, ds


def make_fp8_inputs(torch, p: dict, g, device):
    """Normal values with a magnitude drawn per 128-token block in [1/2, 2] (as flashbench's inputs), quantized per
    block (Q, K) and per head (V)."""
    B, Hq, Hkv, Sq, Skv, D = (p[k] for k in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim"))
    codes, descales, values = [], [], []
    for h, s, block in ((Hq, Sq, FP8_SCALE_BLOCK), (Hkv, Skv, FP8_SCALE_BLOCK), (Hkv, Skv, Skv)):
        nb = (s + block - 1) // block
        mag = torch.exp2(torch.rand(B, h, nb, generator=g, device=device) * 2 - 1)
        x = torch.randn(B, s, h, D, generator=g, device=device).transpose(1, 2)  # [B, H, S, D] view of bshd
        x = x * mag.repeat_interleave(block, dim=2)[:, :, :s, None]
        c, ds = quantize_e4m3(torch, x, block)
        if p["layout"] == "bshd":
            c = c.transpose(1, 2).contiguous().transpose(1, 2)
        values.append(c.float() * ds.repeat_interleave(block, dim=2)[:, :, :s, None])
        codes.append(c)
        descales.append(ds.contiguous())
    descales[2] = descales[2].reshape(B, Hkv).contiguous()  # one per (batch, kv head)
    out = Fp8Inputs(codes)
    out.descales, out.values = tuple(descales), tuple(values)
    return out


def make_inputs(torch, p: dict, seed: int, device):
    if p["dtype"] == "e4m3":
        return make_fp8_inputs(torch, p, torch.Generator(device=device).manual_seed(seed), device)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[p["dtype"]]
    g = torch.Generator(device=device).manual_seed(seed)
    B, Hq, Hkv, Sq, Skv, D = (p[k] for k in ("batch", "heads_q", "heads_kv", "seqlen_q", "seqlen_kv", "head_dim"))

    def t(h, s):
        x = torch.randn(B, s, h, D, generator=g, device=device, dtype=torch.float32).to(dtype)
        # bshd storage viewed as SDPA's [B, H, S, D], as flashbench's kernels see it; bhsd is contiguous
        return x.transpose(1, 2) if p["layout"] == "bshd" else x.transpose(1, 2).contiguous()
    return t(Hq, Sq), t(Hkv, Skv), t(Hkv, Skv)


def reference_check(torch, p: dict, q, k, v, out) -> dict:
    """float64 reference on the GPU, one (batch, head) at a time to bound memory."""
    atol, rtol = TOLERANCE[p["dtype"]]
    scale = p["scale"] or 1.0 / math.sqrt(p["head_dim"])
    grp = p["heads_q"] // p["heads_kv"]
    Sq, Skv = p["seqlen_q"], p["seqlen_kv"]
    max_err, worst, num, den, bad = 0.0, 0.0, 0.0, 0.0, 0
    mask = None
    if p["causal"]:
        i = torch.arange(Sq, device=q.device)[:, None]
        j = torch.arange(Skv, device=q.device)[None, :]
        mask = j <= i + (Skv - Sq)
    for b in range(p["batch"]):
        for h in range(p["heads_q"]):
            qq = q[b, h].double()
            kk, vv = k[b, h // grp].double(), v[b, h // grp].double()
            s = (qq @ kk.T) * scale
            if mask is not None:
                s = s.masked_fill(~mask, float("-inf"))
            m = s.amax(dim=1, keepdim=True)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            e = torch.exp(s - m)
            l = e.sum(dim=1, keepdim=True)
            ref = torch.where(l > 0, (e @ vv) / l.clamp_min(1e-300), torch.zeros_like(qq))  # fully masked row -> 0
            o = out[b, h].double()
            diff = (o - ref).abs()
            diff = torch.where(torch.isfinite(o), diff, torch.full_like(diff, float("inf")))
            max_err = max(max_err, float(diff.max()))
            bound = atol + rtol * ref.abs()
            if p["dtype"] == "e4m3":  # P rounded to e4m3: up to E4M3_P_ROUND of the softmax-weighted |V|
                bound = bound + E4M3_P_ROUND * (e @ vv.abs()) / l.clamp_min(1e-300)
            bad += int((diff > bound).sum())
            num += float((diff[torch.isfinite(diff)] ** 2).sum()) + (float("inf") if not torch.isfinite(diff).all() else 0)
            den += float((ref ** 2).sum())
    rel_l2 = math.sqrt(num / den) if den > 0 else (0.0 if num == 0 else float("inf"))
    if p["dtype"] == "e4m3" and not rel_l2 <= E4M3_REL_L2:
        bad += 1  # the norm bound (flashbench's Tolerance::rel_l2)
    res = {"max_error": max_err if math.isfinite(max_err) else None,
           "rel_l2_error": rel_l2 if math.isfinite(rel_l2) else None, "verified_against": "gpu_f64",
           "tolerance": {"atol": atol, "rtol": rtol}}
    res["_bad"] = bad
    return res


class StoppingRule:
    """harness/src/stopping.cpp's rule, sample for sample: stop at max_samples; or once there are min_samples, at
    least min_time_s of GPU time (the samples' sum, not wall time) and a relative stdev <= max_noise; or at the
    timeout (wall time) once there are min(min_samples, 3). Running sums keep each add() O(1): a rule that
    re-summarised every sample cost milliseconds of host time per sample after a few thousand samples, which left
    the GPU idle a growing share of the loop, and an idler GPU runs cooler and clocks higher than the harness's."""

    def __init__(self, min_samples: int, max_noise: float, min_time_s: float, timeout_s: float, max_samples: int):
        self.min_samples, self.max_noise = min_samples, max_noise
        self.min_time_s, self.timeout_s, self.max_samples = min_time_s, timeout_s, max_samples
        self.samples, self.reason = [], ""
        self._sum = self._sum_sq = 0.0

    def cv(self):
        n = len(self.samples)
        if n < 2 or self._sum <= 0:
            return None
        mean = self._sum / n
        var = max(0.0, (self._sum_sq - n * mean * mean) / (n - 1))
        return math.sqrt(var) / mean

    def timed_out(self, wall_s: float) -> bool:
        return wall_s >= self.timeout_s

    def add(self, sample_us: float, wall_s: float) -> bool:
        self.samples.append(sample_us)
        self._sum += sample_us
        self._sum_sq += sample_us * sample_us
        n = len(self.samples)
        if n >= self.max_samples:
            self.reason = "max_samples"
            return True
        cv = self.cv()
        if n >= self.min_samples and self._sum * 1e-6 >= self.min_time_s and cv is not None and cv <= self.max_noise:
            self.reason = "noise"
            return True
        if self.timed_out(wall_s) and n >= min(self.min_samples, 3):
            self.reason = "timeout"
            return True
        return False


class Batch(list):
    """One batch's samples in us; `who` (Timer.measure_many) the index of the call each sample timed."""
    who = None


class VoidBatch(Batch):
    """Samples timed under another load than the policy asks for (queue back_to_back: the GPU caught up with the
    host, so a launch's latency may be inside them): they count towards busy_fraction and are not kept."""


def sample_loop(batch, rule: StoppingRule, clock=None, max_mhz: int = 0, throttle_fraction: float = 0.75) -> dict:
    """The harness's timed loop (stopping.cpp, sample_loop) without the GPU: `batch()` gives the next samples in us
    (a list: peers time several back to back, see Timer; a VoidBatch is not kept), `clock()` the SM clock in MHz
    (0: unknown), read once per batch. Samples taken under throttle_fraction of max_mhz are dropped; they still
    count towards busy_fraction, the GPU time inside samples over the loop's wall time."""
    return sample_loop_many(batch, [rule], clock, max_mhz, throttle_fraction)[0]


def sample_loop_many(batch, rules: list, clock=None, max_mhz: int = 0, throttle_fraction: float = 0.75) -> list:
    """sample_loop for several calls timed in one loop (Timer.measure_many): a batch's samples carry in `.who` the
    index of the call each timed (untagged: all the first's), each call has its own stopping rule, and the loop runs
    until every rule has stopped; a call whose rule stopped keeps its turn in the batches, so that the load stays
    the same for the others, but its samples are no longer kept. Busy fraction, void batches and the wall time are
    the loop's, the same in every call's statistics."""
    n = len(rules)
    dropped, clocks, busy_us, void_batches, done = [0] * n, [[] for _ in rules], 0.0, 0, [False] * n
    timed_out = lambda wall: all(d or (r.timed_out(wall) and len(r.samples) >= 3) for d, r in zip(done, rules))
    t0 = time.perf_counter()
    while not all(done):
        got = batch()
        who = getattr(got, "who", None) or [0] * len(got)
        busy_us += sum(got)
        wall = time.perf_counter() - t0
        if isinstance(got, VoidBatch):
            void_batches += 1
            if timed_out(wall):
                break
            if rules[0].timed_out(wall * 0.5) and not any(r.samples for r in rules) and void_batches >= 8:
                raise RuntimeError("every batch of samples was void (the host could not keep the GPU's queue)")
            continue
        mhz = clock() if clock else 0
        wall = time.perf_counter() - t0
        if mhz > 0 and max_mhz > 0 and mhz < throttle_fraction * max_mhz:
            for w in who:
                dropped[w] += 1
            if timed_out(wall):
                break
            if rules[0].timed_out(wall * 0.5) and not any(r.samples for r in rules):
                raise RuntimeError("every sample was throttled below {}% of the maximum SM clock".format(
                    int(throttle_fraction * 100)))
            continue
        for us, w in zip(got, who):
            if done[w]:
                continue
            if mhz > 0:
                clocks[w].append(mhz)
            done[w] = rules[w].add(us, wall)
    wall = time.perf_counter() - t0
    out = []
    for w, rule in enumerate(rules):
        st = summarize(rule.samples) if rule.samples else {"median_us": None, "min_us": None, "max_us": None,
                                                           "mean_us": None, "cv": None}
        c = sorted(clocks[w])
        st.update({"samples_us": rule.samples, "dropped_throttled": dropped[w], "stop_reason": rule.reason or "timeout",
                   "noisy": bool(st["cv"] is None or st["cv"] > rule.max_noise), "wall_s": wall,
                   "busy_fraction": busy_us * 1e-6 / wall if wall > 0 else 0.0, "void_batches": void_batches,
                   "sm_clock_mhz": c[len(c) // 2] if c else None})
        out.append(st)
    return out


def hold_us(enqueue_us: float, period_us: float, k: int, margin: float) -> float:
    """How long the GPU must be held for the host to queue k samples before the GPU reaches the first: the host
    needs enqueue_us per sample, the GPU period_us (flush + call). The host must be one sample ahead at the start
    and loses (enqueue_us - period_us) per later sample when it is the slower of the two."""
    return margin * (enqueue_us + (k - 1) * max(0.0, enqueue_us - period_us)) + 20.0


class Nvml:
    """The few NVML reads the harness makes (harness/src/clock.cpp), through pynvml when it is installed; every read
    gives 0 / -1 (unknown) without it."""

    def __init__(self, pci_bus_id, index: int):
        self.nv, self.h = None, None
        try:
            import pynvml
            pynvml.nvmlInit()
            try:
                self.h = pynvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id) if pci_bus_id else None
            except Exception:
                self.h = None
            if self.h is None:
                self.h = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.nv = pynvml
        except Exception:
            self.nv, self.h = None, None

    def _read(self, f, *args, default=0):
        if self.nv is None:
            return default
        try:
            return f(self.h, *args)
        except Exception:
            return default

    def sm_clock_mhz(self) -> int:
        return self._read(self.nv.nvmlDeviceGetClockInfo, self.nv.NVML_CLOCK_SM) if self.nv else 0

    def slowdown_reasons(self) -> int:
        # power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, power brake 0x80 (as clock.cpp)
        return self._read(self.nv.nvmlDeviceGetCurrentClocksThrottleReasons) & 0xEC if self.nv else 0

    def energy_mj(self) -> int:
        return self._read(self.nv.nvmlDeviceGetTotalEnergyConsumption, default=-1) if self.nv else -1


class Timer:
    """The harness's method (harness/include/flashbench/timing.hpp) in torch terms, with the same policy fields
    (taken from the plan unless given on the command line) and the same stopping rule.

    flush "read" (default) sums a buffer of twice the L2 size that nothing writes, leaving the L2 full of clean
    lines; "write" zeroes it (triton's do_bench, nvbench), leaving dirty lines whose write-back the timed call
    pays for.

    Samples go in batches: a spin (torch.cuda._sleep) holds the GPU while the host queues k x (flush, event, call,
    event), so the host's launch latency (python, SDPA dispatch) never lands between a pair of events, as the
    harness's stream hold keeps it out of ours. An event after the spin proves it: if the GPU had already passed
    the spin when the host finished queuing, the batch is void and the next spin is longer. One sample per host
    round trip instead would leave the GPU idle for the round trip (a few hundred microseconds of python), which at
    short calls kept the GPU at a third of the harness's load, cooler and at a higher clock. Each record carries
    busy_fraction and power_w, as the harness's do.

    queue "back_to_back" (timing.hpp; timer.cu's BackToBack is the same): each batch is queued behind the one the
    GPU runs, before the host waits for that one, so the GPU idles only for the flushes. Only the first batch (and
    the first after the host fell behind) waits behind a spin. A batch queued behind is void if the batch ahead had
    already finished when the host was done queuing it; after two such in a row every batch gets its own spin."""

    MAX_BATCH = 64

    def __init__(self, torch, args, l2_bytes: int, nvml: Nvml = None, max_mhz: int = 0):
        self.torch, self.args = torch, args
        self.flush_buf = torch.ones(max(2 * l2_bytes, 1 << 24), dtype=torch.uint8, device="cuda")
        self.flush_how = getattr(args, "flush", "read")
        self.flush_float = self.flush_buf.view(torch.float32)
        self.sleep = getattr(torch.cuda, "_sleep", None)
        self.nvml = nvml or Nvml(None, torch.cuda.current_device())
        self.max_mhz = max_mhz
        ev = lambda: torch.cuda.Event(enable_timing=True)
        # two sets of (starts, ends): the batch the GPU runs and the batch queued behind it (back_to_back)
        self.sets = [([ev() for _ in range(self.MAX_BATCH)], [ev() for _ in range(self.MAX_BATCH)]) for _ in range(2)]
        self.starts, self.ends = self.sets[0]
        self.held = torch.cuda.Event()
        self.void_batches = 0

    def flush(self):
        if self.flush_how == "write":
            self.flush_buf.zero_()
        else:
            # Read as float32 (bytes 0x01: small normal numbers), torch's fastest reduction. Summing the bytes into
            # int32 took far longer than the harness's flush kernel (between_samples_us in the record shows the cost).
            self.flush_float.sum()

    def settle(self, limit_s: float) -> float:
        """Waits (up to limit_s) until NVML reports no power or thermal slowdown, as the harness does before each
        point (timing.settle_s), so that a peer does not inherit the power cap of the previous point."""
        t0 = time.perf_counter()
        while self.nvml.slowdown_reasons() and time.perf_counter() - t0 < limit_s:
            time.sleep(0.02)
        return time.perf_counter() - t0

    def measure(self, fn) -> dict:
        return self.measure_many([fn])[0]

    def measure_many(self, fns: list) -> list:
        """Times several calls in one loop, sample by sample in turn (A B A B ...: `--interleave sample`), so that
        every call is timed in the same power and thermal phases as the others, within a sample of them. One
        statistics dict per call, each from its own stopping rule; the loop's load (busy fraction, power) is shared.
        """
        torch, a = self.torch, self.args
        n_fns = len(fns)
        settle_wait = self.settle(a.settle) if a.settle > 0 else 0.0
        slowdown = self.nvml.slowdown_reasons()
        self.void_batches = 0
        t_host = time.perf_counter()
        self.starts[0].record()
        for _ in range(a.warmup):
            for fn in fns:
                if a.cold:
                    self.flush()
                fn()
        self.ends[0].record()
        self.ends[0].synchronize()
        n_warm = max(a.warmup, 1) * n_fns
        state = {"period": self.starts[0].elapsed_time(self.ends[0]) * 1e3 / n_warm,  # us, GPU, per sample
                 "enqueue": (time.perf_counter() - t_host) * 1e6 / n_warm, "margin": 1.5, "floor": 0.0}

        # who[s]: which call each sample of event set s timed; turn: the call the next queued sample times
        q = {"set": 0, "ahead": False, "ahead_void": False, "behind_voids": 0, "k": [1, 1], "who": [[], []], "turn": 0}

        def batch_size() -> int:
            return max(1, min(self.MAX_BATCH, int(0.01e6 / max(state["period"], 1.0))))  # ~10 ms of GPU work

        def enqueue(s: int, k: int, hold: bool) -> bool:
            """Queues k samples into event set s, behind a spin if `hold`; False if the GPU was already past it."""
            us = 0.0
            if hold and self.sleep is not None:
                us = min(max(hold_us(state["enqueue"], max(state["period"], 1.0), k, state["margin"]),
                             state["floor"]), 200e3)
                self.sleep(int(us * 1e-6 * 2.0e9))  # cycles; a lower clock only makes the hold longer
                self.held.record()
            starts, ends = self.sets[s]
            t1 = time.perf_counter()
            q["who"][s] = []
            for i in range(k):
                if a.cold:
                    self.flush()
                q["who"][s].append(q["turn"])
                starts[i].record()
                fns[q["turn"]]()
                ends[i].record()
                q["turn"] = (q["turn"] + 1) % n_fns
            state["enqueue"] = (time.perf_counter() - t1) * 1e6 / k
            q["k"][s] = k
            if hold and self.sleep is not None and self.held.query():
                state["margin"] *= 2  # the GPU got ahead of the host: launch latency may be inside the samples
                state["floor"] = 2 * us
                return False
            return True

        def read(s: int, valid: bool) -> list:
            """Waits for the batch in event set s: its samples in us (and, if valid, its period and flush gap)."""
            starts, ends = self.sets[s]
            n = q["k"][s]
            ends[n - 1].synchronize()
            if valid:
                state["period"] = starts[0].elapsed_time(ends[n - 1]) * 1e3 / n
                state["gap"] = ends[0].elapsed_time(starts[1]) * 1e3 if n > 1 else 0.0
            got = Batch(starts[i].elapsed_time(ends[i]) * 1e3 for i in range(n))  # ms -> us
            got.who = q["who"][s][:n]
            return got

        def batch():  # round_trip: one batch per host round trip
            k = batch_size()
            for _ in range(8):
                in_time = enqueue(0, k, True)
                got = read(0, in_time)
                if in_time:
                    return got
                self.void_batches += 1
            raise RuntimeError("the host could not queue a batch of samples ahead of the GPU")

        def back_to_back():
            s = q["set"]
            if not q["ahead"]:
                q["ahead"], q["ahead_void"] = True, not enqueue(s, batch_size(), True)
            pipelined = q["behind_voids"] < 2
            if pipelined:
                enqueue(1 - s, batch_size(), False)
            behind_void = pipelined and self.sets[s][1][q["k"][s] - 1].query()
            is_void = q["ahead_void"]
            got = read(s, not is_void)
            if behind_void:
                q["behind_voids"] += 1
            elif pipelined:
                q["behind_voids"] = 0  # once the host fell behind twice in a row, a spin before every batch
            if pipelined:
                q["set"], q["ahead_void"] = 1 - s, behind_void
            else:
                q["ahead"] = False
            if is_void:
                self.void_batches += 1
                return VoidBatch(got)
            return got

        rules = [StoppingRule(a.min_samples, a.max_noise, a.min_time, a.timeout, a.max_samples) for _ in fns]
        e0 = self.nvml.energy_mj()
        queued = getattr(a, "queue", "round_trip") == "back_to_back"
        stats = sample_loop_many(back_to_back if queued else batch, rules, self.nvml.sm_clock_mhz, self.max_mhz,
                                 a.throttle_fraction)
        e1 = self.nvml.energy_mj() if e0 >= 0 else -1
        torch.cuda.synchronize()  # the batch still queued behind the last one read
        for st in stats:
            st["power_w"] = power_w(e0, e1, st["wall_s"])
            st["settle_wait_s"] = settle_wait
            st["slowdown_at_start"] = slowdown
            # round_trip: retried inside batch(); back_to_back: as sample_loop counted
            st["void_batches"] = self.void_batches
            st["host_enqueue_us"] = state["enqueue"]  # host time to queue one sample, last batch
            st["between_samples_us"] = state.get("gap")  # GPU time from one sample's end to the next's start
        return stats


def power_w(e0_mj: float, e1_mj: float, wall_s: float) -> float:
    """Mean power from two reads of NVML's energy counter; 0 (unknown) for loops under 0.5 s, where the counter's
    update interval (tens of ms on an H200: loops of 60 ms read 0 to 1000 W) swamps the mean."""
    if e0_mj < 0 or e1_mj < e0_mj or wall_s < 0.5:
        return 0.0
    return (e1_mj - e0_mj) * 1e-3 / wall_s


def sm_clock_mhz(torch):
    try:
        return int(torch.cuda.clock_rate())  # needs pynvml; MHz
    except Exception:
        return None


def nvidia_smi(index: int) -> dict:
    try:
        out = subprocess.run(["nvidia-smi", "-i", str(index), "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem,"
                              "pci.bus_id", "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=20).stdout.strip().split(",")
        drv, sm, mem, bus = (x.strip() for x in out[:4])
        as_int = lambda x: int(x) if x.isdigit() else None
        return {"driver_version_string": drv or None, "sm_clock_max_mhz": as_int(sm), "mem_clock_max_mhz": as_int(mem),
                "pci_bus_id": bus or None}
    except Exception:
        return {}


def device_info(torch) -> dict:
    idx = torch.cuda.current_device()
    pr = torch.cuda.get_device_properties(idx)
    smi = nvidia_smi(idx)
    name = pr.name
    drv = smi.get("driver_version_string")
    bus = smi.get("pci_bus_id")
    if not bus and hasattr(pr, "pci_bus_id"):
        bus = "{:04x}:{:02x}:{:02x}.0".format(getattr(pr, "pci_domain_id", 0), pr.pci_bus_id, getattr(pr, "pci_device_id", 0))
    return {"name": name, "slug": re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"), "pci_bus_id": bus,
            "cc": "{}.{}".format(pr.major, pr.minor), "sm_count": pr.multi_processor_count,
            "l2_bytes": getattr(pr, "L2_cache_size", None), "total_mem_bytes": pr.total_memory,
            "sm_clock_max_mhz": smi.get("sm_clock_max_mhz") or (getattr(pr, "clock_rate", 0) // 1000 or None),
            "mem_clock_max_mhz": smi.get("mem_clock_max_mhz"),
            "mem_bus_width_bits": getattr(pr, "memory_bus_width", None),
            "driver_version": int(drv.split(".")[0]) * 1000 if drv and drv.split(".")[0].isdigit() else None,
            "driver_version_string": drv, "runtime_version": torch.version.cuda,
            "torch_version": torch.__version__}


def measure_ceilings(torch, args) -> dict:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    mm = Timer(torch, argparse.Namespace(**dict(vars(args), cold=False, min_samples=20, max_samples=200,
                                                min_time=0.5, timeout=10.0, max_noise=0.01)), 0)
    t_mm = mm.measure(lambda: torch.mm(a, b))["median_us"]
    # The e4m3 ceiling (the fa3_fp8 variant's GEMMs): torch._scaled_mm, e4m3 x e4m3 -> bf16, unit scales.
    fp8 = None
    try:
        a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t()
        one = torch.ones((), device="cuda")
        t8 = mm.measure(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        fp8 = 2.0 * n ** 3 / (t8["median_us"] * 1e-6) / 1e12
        del a8, b8
    except Exception:  # an older torch or GPU without it: the ceiling is absent, not guessed
        pass
    del a, b
    copy_elems = 1 << 30  # 1 GiB each way, far larger than any L2
    src = torch.empty(copy_elems, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    t_cp = mm.measure(lambda: dst.copy_(src))["median_us"]
    del src, dst
    torch.cuda.empty_cache()
    return {"gemm_bf16_tflops": 2.0 * n ** 3 / (t_mm * 1e-6) / 1e12, "gemm_mnk": "{0}x{0}x{0}".format(n),
            "gemm_e4m3_tflops": fp8,
            "copy_gbps": 2.0 * copy_elems / (t_cp * 1e-6) / 1e9, "copy_bytes": 2 * copy_elems,
            "sm_clock_mhz": sm_clock_mhz(torch), "measured_by": "scripts/peers.py (torch.mm, Tensor.copy_)"}


def git_sha() -> str:
    """The source tree's commit, as CMakeLists.txt stamps the harness's results: FLASHBENCH_SOURCE_SHA wins; else git's
    HEAD, but only where this checkout is the repository itself. A snapshot extracted inside another checkout (a GPU
    runner's copy) would otherwise be stamped with the enclosing repository's HEAD: unknown then ("")."""
    if os.environ.get("FLASHBENCH_SOURCE_SHA"):
        return os.environ["FLASHBENCH_SOURCE_SHA"].strip()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        r = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], capture_output=True, text=True,
                           timeout=10, cwd=root)
        out = r.stdout.split()
        if r.returncode != 0 or len(out) != 2 or os.path.realpath(out[0]) != os.path.realpath(root):
            return ""
        return out[1]
    except Exception:
        return ""


def first_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return "{}: {}".format(type(e).__name__, msg[0] if msg else "")[:300]


def prepare_peer(torch, pe: Peer, inputs, seed: int, verify: bool, graph: bool = True):
    """Builds, runs once and verifies one peer on a problem's inputs. Returns (record, None) where it is not to be
    timed (skipped, incorrect, crashed), else (None, (fn to time, check, how it is launched))."""
    p, name = pe.p, pe.name
    rec = lambda status, why, check=None: record(name, p, status, why, check=check, seed=seed, extra=pe.extra,
                                                 config_str=pe.config or "")
    why = pe.skip_reason()
    if why:
        return rec("skipped", why), None
    if inputs is None:
        return rec("skipped", "inputs do not fit in device memory"), None
    q, k, v = inputs
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            pe.inputs = inputs  # e4m3: build() reads the descales (Fp8Inputs)
            fn = pe.build(q, k, v)
            out = fn()
            torch.cuda.synchronize()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return rec("skipped", "out of device memory"), None
    except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
        # SDPA raises RuntimeError "No available kernel" and gives its reasons as warnings: keep the telling one
        why = [str(w.message).split(" (Triggered internally")[0] for w in caught]
        why = [w for w in why if not w.rstrip().endswith("because:") and "runtime disabled" not in w]
        return rec("skipped", "{} cannot run this problem: {}".format(
            name, why[0][:300] if why else first_line(e))), None
    except Exception as e:  # torch.compile/inductor failures surface as their own exception types
        return rec("crashed", first_line(e)), None
    check = {}
    if verify:
        # e4m3: the reference of the values the peer computes on (its own descales, or the per-block ones)
        rq, rk, rv = getattr(pe, "ref_values", None) or getattr(inputs, "values", None) or (q, k, v)
        check = reference_check(torch, p, rq, rk, rv, out)
        bad = check.pop("_bad")
        if bad:
            return rec("incorrect", "{} elements beyond atol+rtol*|ref| (max error {})".format(
                bad, check["max_error"]), check), None
    replay, graph_why = as_graph(torch, fn, out.clone(), pe.poison) if graph else (None, "--eager")
    del out
    return None, (replay or fn, check, "cuda_graph" if replay else "eager ({})".format(graph_why))


def time_peer(torch, timer, pe: Peer, ready, seed: int, rep=(0, 1), timing=None) -> dict:
    """The record of one timing of a prepared peer: timed here, or `timing` as measure_many gave it (an exception
    if that loop failed)."""
    fn, check, launch = ready
    cfg = pe.config or ""
    try:
        if timing is None:
            timing = timer.measure(fn)
        elif isinstance(timing, Exception):
            raise timing
    except Exception as e:
        return record(pe.name, pe.p, "crashed", first_line(e), check=check, seed=seed, extra=pe.extra,
                      config_str=cfg, rep=rep)
    timing["launch"] = launch
    return record(pe.name, pe.p, "ok", "", timing, check, seed, pe.extra, config_str=cfg, rep=rep)


def run_problem(torch, timer, peers: list, p: dict, seed: int, verify: bool, rounds: int, graph: bool = True,
                interleave: str = "round") -> list:
    """Every peer on one problem, on one set of inputs: each built and verified, then timed `rounds` times in turn
    (the order reversed every other round), so that each round's records were timed within moments of each
    other. interleave "sample": in each round all of them in one timed loop, sample by sample in turn
    (Timer.measure_many), so that each sample of one was taken within a sample of the others'."""
    records, ready = [], []
    try:
        inputs = make_inputs(torch, p, seed, "cuda")
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        inputs = None
    for pe in peers:
        rec, r = prepare_peer(torch, pe, inputs, seed, verify, graph)
        if rec:
            records.append(rec)
        else:
            ready.append((pe, r))
    for i in range(rounds):
        order = ready if i % 2 == 0 else ready[::-1]
        if interleave == "sample" and len(order) > 1:
            try:
                stats = timer.measure_many([r[0] for _, r in order])
            except Exception as e:
                stats = [e] * len(order)
            for (pe, r), st in zip(order, stats):
                records.append(time_peer(torch, timer, pe, r, seed, (i, rounds), st))
            continue
        for pe, r in order:
            records.append(time_peer(torch, timer, pe, r, seed, (i, rounds)))
    for pe in peers:
        pe.close()
    return records


def as_graph(torch, fn, eager_out, poison=None):
    """The peer's call captured in a CUDA graph, whose replay costs the host ~10 us instead of the ~100s of us of
    python and SDPA dispatch per eager call: the host then keeps ahead of the GPU and the timed loop's load comes
    close to the harness's. The GPU runs the same kernels; the replay's output must equal the verified eager
    output bit for bit, else the eager call is timed. Returns (replay or None, why not)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fn()
        if poison:  # fn writes the same buffers every call: the replay must rewrite them
            poison()
        g.replay()
        torch.cuda.synchronize()
        if not torch.equal(out, eager_out):
            return None, "graph replay output differs from the eager call"
        return g.replay, ""
    except Exception as e:
        torch.cuda.synchronize()
        return None, "not capturable: " + first_line(e)[:120]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", required=True, help="plan.json: {\"problems\": [...]}")
    ap.add_argument("-o", "--out", required=True, help="results JSON to write")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated subset of " + ",".join(PEERS))
    ap.add_argument("--ceilings", action="store_true", help="also measure bf16 GEMM 8192³ and copy bandwidth")
    # Timing: the plan's timing_policy (what `flashbench run` of the same spec uses), unless given here
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--min-samples", type=int, default=None)
    ap.add_argument("--max-samples", type=int, default=None)
    ap.add_argument("--min-time", type=float, default=None, help="seconds of GPU time summed over the samples")
    ap.add_argument("--timeout", type=float, default=None, help="seconds per point (wall)")
    ap.add_argument("--max-noise", type=float, default=None, help="relative stdev target")
    ap.add_argument("--settle", type=float, default=None, help="seconds to wait for power/thermal slowdown to clear")
    ap.add_argument("--warm", dest="cold", action="store_const", const=False, default=None,
                    help="do not flush L2 before each sample")
    ap.add_argument("--queue", choices=("round_trip", "back_to_back"), default=None,
                    help="the timed loop's load (timing.hpp): the plan's timing.queue unless given")
    ap.add_argument("--flush", choices=("read", "write"), default=None,
                    help="L2 flush: read a 2x-L2 buffer (clean lines, default) or write it (as do_bench)")
    ap.add_argument("--ours", default=None, metavar="VARIANT",
                    help="also time this catalog variant here, through libflashbench_capi.so, with the same timer "
                         "and interleaved with the peers (give --ours-config or --ours-best)")
    ap.add_argument("--ours-config", default=None, help="--ours's config on every problem: name=value,... | default")
    ap.add_argument("--ours-best", default=None, metavar="RESULTS",
                    help="--ours's config per problem: its fastest verified one in this `flashbench run` results file")
    ap.add_argument("--lib", default=None, help="libflashbench_capi.so (default: $FB_BUILD or build/, beside "
                                                  "scripts/)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time each problem's peers this many times in turn (records carry repetition_index)")
    ap.add_argument("--ours-top", type=int, default=1, metavar="K",
                    help="with --ours-best: time the K fastest configs per problem (by their fastest sample), each "
                         "as its own entry; scripts/peer_table.py picks among them on the first round")
    ap.add_argument("--interleave", choices=("round", "sample"), default="round",
                    help="with several peers (or --ours): time them one after another in each round (round), or "
                         "all in one timed loop, sample by sample in turn (sample: each sample within a sample of "
                         "the others', so a power phase falls on all of them alike)")
    ap.add_argument("--eager", dest="graph", action="store_false",
                    help="time the eager calls, not their CUDA-graph replay (the host may then fall behind the GPU)")
    ap.add_argument("--no-verify", dest="verify", action="store_false")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args(argv)
    peers = [x.strip() for x in args.peers.split(",") if x.strip()]
    try:
        unknown = [x for x in peers if x not in PEERS]
        if unknown:
            raise UserError("--peers: unknown {}; choose from {}".format(",".join(unknown), ",".join(PEERS)))
        problems, plan_spec, plan_timing = load_plan(args.problems)
        resolve_timing(args, plan_timing)
        if args.rounds < 1:
            raise UserError("--rounds {}: give 1 or more".format(args.rounds))
        if args.ours_top < 1 or (args.ours_top > 1 and not args.ours_best):
            raise UserError("--ours-top {}: give 1 or more, with --ours-best RESULTS".format(args.ours_top))
        ours_configs = None
        if args.ours:
            if (args.ours_config is None) == (args.ours_best is None):
                raise UserError("--ours {}: give one of --ours-config CONFIG and --ours-best RESULTS".format(args.ours))
            ours_configs = (best_configs(args.ours_best, args.ours, args.ours_top) if args.ours_best
                            else {problem_key(p): [args.ours_config] for p in problems})
        elif args.ours_config or args.ours_best:
            raise UserError("--ours-config and --ours-best need --ours VARIANT")
    except UserError as e:
        print("peers.py: error: {}".format(e), file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("peers.py: torch is not installed; no peer results written")
        return 0
    if not torch.cuda.is_available():
        print("peers.py: no CUDA device visible to torch {}; no peer results written".format(torch.__version__))
        return 0

    lib = None
    if args.ours:
        try:
            lib = CapiLib(args.lib or os.path.join(os.environ.get("FB_BUILD") or os.path.join(
                os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build"), "libflashbench_capi.so"))
        except UserError as e:
            print("peers.py: error: {}".format(e), file=sys.stderr)
            return 2
    dev = device_info(torch)
    timer = Timer(torch, args, dev.get("l2_bytes") or (64 << 20), Nvml(dev.get("pci_bus_id"), torch.cuda.current_device()),
                  dev.get("sm_clock_max_mhz") or 0)
    ctx = {"date": dt.datetime.now(dt.timezone.utc).astimezone().isoformat(timespec="seconds"),
           "host_name": socket.gethostname(), "executable": os.path.abspath(__file__), "num_cpus": os.cpu_count(),
           "mhz_per_cpu": 0, "cpu_scaling_enabled": False, "caches": [],
           "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else [],
           "library_build_type": "release", "schema_version": SCHEMA_VERSION,
           "flashbench": {"version": "peers.py", "git_sha": git_sha(), "build_type": "python " + platform.python_version()},
           "spec": plan_spec or {"name": os.path.splitext(os.path.basename(args.problems))[0], "path": args.problems},
           "device": dev, "ceilings": measure_ceilings(torch, args) if args.ceilings else None,
           "timing_policy": dict({f: getattr(args, n) for n, (f, _) in TIMING_FIELDS.items()}, timer="cuda_events"),
           "rounds": args.rounds, "interleave": args.interleave,
           "ours": {"variant": args.ours, "lib": lib.path,
                    "configs": args.ours_config or "the {} fastest by min_us in {}".format(args.ours_top, args.ours_best)}
                   if lib else None}
    records = []
    # As `flashbench run` does: every finished record goes to <out>.partial.jsonl at once, so that a run cut short
    # (a call's time limit, a hung backend) keeps what it measured; the final file replaces it.
    partial_path = args.out + ".partial.jsonl"
    os.makedirs(os.path.dirname(os.path.abspath(partial_path)), exist_ok=True)
    partial = open(partial_path, "w")
    for i, p in enumerate(problems):
        bound = [Peer(torch, peer, p) for peer in peers]
        if lib:
            bound[:0] = [Ours(torch, lib, args.ours, c, p) for c in ours_configs.get(problem_key(p)) or [None]]
        for rec in run_problem(torch, timer, bound, p, args.seed + i, args.verify, args.rounds, args.graph,
                               args.interleave):
            records.append(rec)
            append_partial(partial, rec)
            print("{:<9} {:<18} {}".format(rec["status"], rec["variant"], rec["name"].split("/")[-1]) +
                  ("  {:.1f} TFLOP/s".format(rec["tflops"]) if rec.get("tflops") else "  " + rec["reason"]) +
                  ("  (round {})".format(rec["repetition_index"]) if args.rounds > 1 else ""), flush=True)
        torch.cuda.empty_cache()
    write_atomic(args.out, {"context": ctx, "benchmarks": records})
    partial.close()
    os.remove(partial_path)
    print("wrote {} records to {}".format(len(records), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
