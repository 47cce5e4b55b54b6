"""Synthetic results files in flashbench's schema for tests (seeded; no GPU, no harness)."""
from __future__ import annotations

import json
import math
import random
from typing import Any, Dict, List, Optional

H100 = {"name": "NVIDIA H100 80GB HBM3", "slug": "nvidia-h100-80gb-hbm3", "pci_bus_id": "0000:18:00.0", "cc": "9.0",
        "sm_count": 132, "l2_bytes": 52428800, "total_mem_bytes": 85017853952, "sm_clock_max_mhz": 1980,
        "mem_clock_max_mhz": 2619, "mem_bus_width_bits": 5120, "driver_version": 13000,
        "driver_version_string": "580.65.06", "runtime_version": 13000}
H200 = dict(H100, name="NVIDIA H200", slug="nvidia-h200", total_mem_bytes=150754820096, mem_clock_max_mhz=3201,
            mem_bus_width_bits=6144, pci_bus_id="0000:19:00.0")


def context(device=None, ceilings: Optional[dict] = "default", schema_version=1, git_sha="abc1234",
            queue=None) -> Dict[str, Any]:
    if ceilings == "default":
        ceilings = {"gemm_bf16_tflops": 700.0, "gemm_mnk": "8192x8192x8192", "copy_gbps": 3000.0,
                    "copy_bytes": 2147483648, "sm_clock_mhz": 1980}
    return {"date": "2025-01-01T00:00:00+00:00", "host_name": "testhost", "executable": "build/flashbench",
            "num_cpus": 16, "mhz_per_cpu": 2000, "cpu_scaling_enabled": False, "caches": [],
            "load_avg": [0.1, 0.1, 0.1], "library_build_type": "release", "schema_version": schema_version,
            "flashbench": {"version": "0.1.0", "git_sha": git_sha, "build_type": "Release"},
            "spec": {"name": "synthetic", "path": "sweeps/synthetic.yaml"}, "device": device or H100,
            "ceilings": ceilings,
            "timing_policy": dict({"min_samples": 10, "max_noise": 0.005, "min_time_s": 0.5, "timeout_s": 15,
                                   "cold": True}, **({"queue": queue} if queue else {}))}


def problem(seqlen=1024, seqlen_q=None, batch=1, heads_q=16, heads_kv=16, head_dim=128, causal=False, dtype="bf16"):
    return {"batch": batch, "heads_q": heads_q, "heads_kv": heads_kv, "seqlen_q": seqlen_q or seqlen,
            "seqlen_kv": seqlen, "head_dim": head_dim, "causal": causal, "dtype": dtype, "layout": "bshd", "scale": 0}


def key(p) -> str:
    return "b{batch}_hq{heads_q}_hkv{heads_kv}_sq{seqlen_q}_skv{seqlen_kv}_d{head_dim}".format(**p) + \
        ("_causal" if p["causal"] else "") + "_" + p["dtype"]


def unmasked_pairs(p) -> int:
    sq, skv = p["seqlen_q"], p["seqlen_kv"]
    if not p["causal"]:
        return sq * skv
    return sum(max(0, min(skv, i + skv - sq + 1)) for i in range(sq))


def flops(p) -> float:
    return 4.0 * p["batch"] * p["heads_q"] * p["head_dim"] * unmasked_pairs(p)


def output_bytes(p) -> float:
    """O (bf16 for e4m3 inputs, else the input dtype) and the fp32 LSE."""
    el = {"fp32": 4, "fp16": 2, "bf16": 2, "e4m3": 2}[p["dtype"]]
    return el * p["batch"] * p["heads_q"] * p["seqlen_q"] * p["head_dim"] + 4 * p["batch"] * p["heads_q"] * p["seqlen_q"]


def bytes_min(p) -> float:
    el = {"fp32": 4, "fp16": 2, "bf16": 2, "e4m3": 1}[p["dtype"]]
    q = p["batch"] * p["heads_q"] * p["seqlen_q"] * p["head_dim"]
    kv = p["batch"] * p["heads_kv"] * p["seqlen_kv"] * p["head_dim"]
    return el * (q + 2 * kv) + output_bytes(p)


def record(variant: str, config: Dict[str, Any], prob: Dict[str, Any], median_us: float = 100.0, cv: float = 0.003,
           n: int = 50, rng: Optional[random.Random] = None, status: str = "ok", reason: str = "",
           counters: bool = False, bytes_model: Any = "default", dram: Optional[tuple] = None,
           extra: Optional[dict] = None) -> Dict[str, Any]:
    """bytes_model: a number or None (default: 1.5 x bytes_min, None for peers); dram: measured (read, write) bytes
    (default with counters: 1.3 and 0.3 x bytes_min); extra: more fields for the record."""
    rng = rng or random.Random(0)
    cfg_str = ",".join("{}={}".format(k, v) for k, v in config.items())
    name = "{}/{}/{}".format(variant, cfg_str, key(prob)) if not variant.startswith("peer:") else \
        "{}/{}".format(variant, key(prob))
    rec = {"name": name, "run_name": name, "run_type": "iteration", "repetitions": 1, "repetition_index": 0,
           "threads": 1, "time_unit": "us", "variant": variant, "config": config, "config_str": cfg_str,
           "problem": prob, "status": status, "reason": reason, "flops": flops(prob), "bytes_min": bytes_min(prob),
           "bytes_model": (None if variant.startswith("peer:") else bytes_min(prob) * 1.5) if bytes_model == "default"
           else bytes_model,
           "verified_against": "cpu_f64", "seed": 1, "sm_clock_mhz": 1980, "dropped_throttled": 0, "counters": None}
    rec.update(extra or {})
    if status != "ok":
        rec.update({"error_occurred": True, "error_message": reason, "iterations": 0, "real_time": 0, "cpu_time": 0,
                    "tflops": None, "median_us": None, "samples_us": [], "max_error": 0.5 if status == "incorrect"
                    else None})
        return rec
    samples = [median_us * (1 + rng.gauss(0, cv)) for _ in range(n)]
    s = sorted(samples)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    mean = sum(s) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in s) / (n - 1))
    rec.update({"iterations": n, "real_time": med, "cpu_time": med, "median_us": med, "min_us": s[0], "max_us": s[-1],
                "mean_us": mean, "cv": sd / mean, "samples_us": samples, "noisy": False,
                "tflops": flops(prob) / (med * 1e-6) / 1e12, "max_error": 1e-3, "rel_l2_error": 1e-3})
    if counters:
        rd, wr = dram if dram else (bytes_min(prob) * 1.3, bytes_min(prob) * 0.3)
        rec["counters"] = {"dram_read_bytes": rd, "dram_write_bytes": wr,
                           "achieved_occupancy_pct": rng.uniform(20, 45), "tensor_active_pct": 50.0}
        rec["occupancy"] = {"theoretical_pct": 50.0, "limiter": rng.choice(["registers", "shared_memory"]),
                            "blocks_per_sm": 2, "registers": 128, "smem_bytes": 98304}
    return rec


def doc(records: List[dict], **ctx) -> Dict[str, Any]:
    return {"context": context(**ctx), "benchmarks": records}


def write(path, d) -> str:
    with open(path, "w") as f:
        json.dump(d, f)
    return str(path)


def time_for(prob, tflops: float) -> float:
    return flops(prob) / (tflops * 1e12) * 1e6


def sweep(rng_seed=0, speed=1.0, counters=True) -> List[dict]:
    """A sweep with several variants and seqlens, peers, a tile tuning sweep, split_q/split_k and bad points."""
    rng = random.Random(rng_seed)
    recs = []
    rates = {"naive": 60, "fa1_kv_outer": 180, "fa2_q_outer": 330, "fa3_pipelined": 520, "peer:torch_flash": 480,
             "peer:flex": 400}
    for causal in (False, True):
        for s in (512, 1024, 2048, 4096):
            p = problem(s, causal=causal)
            for v, rate in rates.items():
                cfg = {} if v.startswith("peer:") else {"block_m": 128, "block_n": 64}
                if v == "fa2_q_outer":
                    for lay, f in (("split_q", 1.0), ("split_k", 0.8)):
                        c = dict(cfg, warp_layout=lay)
                        recs.append(record(v, c, p, time_for(p, rate * f * speed * (s / 4096) ** 0.2), rng=rng,
                                           counters=counters))
                    continue
                recs.append(record(v, cfg, p, time_for(p, rate * speed * (s / 4096) ** 0.2), rng=rng, counters=counters))
    # tile tuning sweep of fa3 on one problem
    p = problem(4096)
    for bm in (64, 128, 192):
        for bn in (64, 128, 176):
            cfg = {"block_m": bm, "block_n": bn, "stages": 2}
            if bm == 192 and bn == 176:
                recs.append(record("fa3_pipelined", cfg, p, status="skipped",
                                   reason="shared memory 245760 B exceeds the 232448 B per-block limit"))
                continue
            rate = 300 + bm + bn
            recs.append(record("fa3_pipelined", cfg, p, time_for(p, rate * speed), rng=rng, counters=counters))
    p = problem(2048, dtype="fp32")
    recs.append(record("peer:torch_flash", {}, p, status="skipped", reason="flash backend needs fp16/bf16"))
    recs.append(record("fa1_kv_outer", {"block_m": 64, "block_n": 64}, p, status="incorrect",
                       reason="max error 0.5 > tolerance 0.01 at (0, 3, 17, 5)"))
    recs.append(record("fa2_q_outer", {"block_m": 64, "block_n": 64}, p, status="crashed",
                       reason="cudaErrorIllegalAddress at kernels/fa2_q_outer/kernel.cu:212"))
    return recs


# The bring-up catalog: prefill at B*N = 16384 tokens, H*d = 2048 (bf16 and e4m3), and GQA 32/8 decode.
BRINGUP_PREFILL = [problem(n, batch=16384 // n, heads_q=16, heads_kv=16, causal=c) for n in (1024, 4096)
                   for c in (False, True)]
BRINGUP_FP8 = [dict(p, dtype="e4m3") for p in BRINGUP_PREFILL]
BRINGUP_DECODE = [problem(skv, seqlen_q=1, batch=b, heads_q=32, heads_kv=8) for b, skv in ((1, 32768), (8, 32768),
                                                                                          (32, 8192))]
# Fraction of the roofline each variant reaches: (prefill, decode).
BRINGUP_EFFICIENCY = {"naive": (0.06, 0.10), "fa1_kv_outer": (0.25, 0.20), "fa2_q_outer": (0.50, 0.30),
                      "fa3_pipelined": (0.75, 0.35), "fa3_fp8": (1.10, None), "flash_decoding": (None, 0.85)}


def roofline_us(prob, gemm_tflops: float, copy_gbps: float) -> float:
    return max(flops(prob) / (gemm_tflops * 1e12), bytes_min(prob) / (copy_gbps * 1e9)) * 1e6


def bringup(gemm_tflops: float, copy_gbps: float, seed: int = 0, slow: Optional[Dict[str, float]] = None
            ) -> List[dict]:
    """Every catalog variant on compute-bound prefill and memory-bound decode, timed as if each reached a fixed
    fraction of this GPU's roofline (times `slow[variant]` where given: a variant that gains less than its bound).
    Counters: decode and fa3 prefill moved fewer bytes than bytes_min (40% of the output still in L2); fa2's model is
    30% above its measured bytes, fa3_pipelined's 40% with a bytes_model_reason."""
    rng = random.Random(seed)
    slow = slow or {}
    recs = []
    for probs, kind in ((BRINGUP_PREFILL + BRINGUP_FP8, 0), (BRINGUP_DECODE, 1)):
        for p in probs:
            for v, eff in BRINGUP_EFFICIENCY.items():
                e = eff[kind]
                if e is None or (v == "fa3_fp8") != (p["dtype"] == "e4m3"):
                    continue
                t = roofline_us(p, gemm_tflops, copy_gbps) / (e * slow.get(v, 1.0))
                mn, out = bytes_min(p), output_bytes(p)
                model, extra = mn * 1.1, None
                dram = (mn - out, out)
                if v in ("fa3_pipelined", "flash_decoding") or kind == 1:
                    dram = (mn - out, 0.6 * out)
                if v == "fa2_q_outer":
                    dram, model = (mn * 1.0, out), mn * 1.3 * (mn + out) / mn
                if v == "fa3_pipelined" and kind == 0:
                    model = (mn - 0.4 * out) * 1.4
                    extra = {"bytes_model_reason": "no-reuse bound: K/V re-read per Q tile, L2 reuse not modelled"}
                if v == "naive":
                    dram = (mn * 6, mn * 4)
                    model = mn * 10
                cfg = {"block_m": 128, "block_n": 128} if v != "naive" else {"softmax_threads": 256}
                recs.append(record(v, cfg, p, t, rng=rng, counters=True, bytes_model=model, dram=dram, extra=extra))
    return recs
