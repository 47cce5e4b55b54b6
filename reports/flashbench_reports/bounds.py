"""Roofline bounds from a GPU's measured ceilings: the one place the reports turn FLOPs and bytes into a best time.

A point's arithmetic intensity is FLOPs / bytes_min (the least traffic any kernel needs, Q, K, V read once and the
output written once). Against a GPU's ridge point (measured GEMM rate / measured copy bandwidth, FLOPs per byte) it
is compute-bound above the ridge and memory-bound below. The roofline time is max(FLOPs / GEMM rate,
bytes_min / copy bandwidth); a bring-up's predicted speed-up is the ratio of the two GPUs' roofline times, which is
the GEMM ratio for points above both ridges and the bandwidth ratio for points below both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from . import results as R

FP8_DTYPES = ("e4m3",)


@dataclass
class Roof:
    """One GPU's measured ceilings for one dtype: compute in TFLOP/s, bandwidth in GB/s (read + write)."""
    tflops: float
    gbps: float
    compute_name: str  # which GEMM ceiling: "bf16 GEMM" or "e4m3 GEMM"

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the compute roof meets the bandwidth roof."""
        return self.tflops * 1e12 / (self.gbps * 1e9)

    def time_us(self, flops: float, nbytes: float) -> float:
        """The roofline's least time for this work: whichever of compute and traffic takes longer."""
        return max(flops / (self.tflops * 1e12), nbytes / (self.gbps * 1e9)) * 1e6

    def attainable_tflops(self, flops: float, nbytes: float) -> float:
        return flops / (self.time_us(flops, nbytes) * 1e-6) / 1e12


def compute_ceiling(res: R.Results, dtype: Optional[str]) -> "tuple[Optional[float], str]":
    """The GEMM ceiling that bounds a point of this dtype: e4m3 points use the e4m3 GEMM where the file has it
    (scripts/peers.py --ceilings measures it), else the bf16 GEMM; every other dtype the bf16 GEMM."""
    if dtype in FP8_DTYPES and res.ceiling("gemm_e4m3_tflops"):
        return res.ceiling("gemm_e4m3_tflops"), "e4m3 GEMM"
    return res.ceiling("gemm_bf16_tflops"), "bf16 GEMM"


def roof(res: R.Results, dtype: Optional[str] = None) -> Optional[Roof]:
    """This file's roof for points of `dtype`, or None without both a GEMM and a copy ceiling."""
    t, name = compute_ceiling(res, dtype)
    bw = res.ceiling("copy_gbps")
    if t is None or bw is None:
        return None
    return Roof(tflops=t, gbps=bw, compute_name=name)


def intensity(p: R.Point) -> Optional[float]:
    """FLOPs per minimum byte, or None when the record lacks either."""
    f, b = p.flops(), p.num("bytes_min")
    return f / b if f and b else None


def pct_of_roof(p: R.Point, r: Roof) -> Optional[float]:
    """The point's speed as a percentage of the roofline's at its minimum bytes: 100 = as fast as the measured
    GEMM (compute-bound) or copy (memory-bound) allows."""
    f, b = p.flops(), p.num("bytes_min")
    if not (f and b and p.median_us):
        return None
    return 100.0 * r.time_us(f, b) / p.median_us


def bound_kind(ai: float, ridges: "list[float]") -> str:
    """'compute' above every ridge, 'memory' below every ridge, else 'between' (compute-bound on one GPU and
    memory-bound on the other)."""
    if all(ai >= x for x in ridges):
        return "compute"
    if all(ai < x for x in ridges):
        return "memory"
    return "between"
