"""The paired gate's verdict: reference and candidate builds timed on one GPU, interleaved sample by sample.

Pairs (r_i, c_i) are the i-th samples of each side from one interleaved loop (R C R C ..., the order swapped
between attempts), so both saw the same clock, temperature and neighbours within a sample; d_i = ln(c_i / r_i)
removes what they share. On d:
- the change is exp(median d) - 1, with a distribution-free 95% interval (stats.median_ci);
- significance is the paired test's: Wilcoxon signed-rank p < alpha AND Perfherder's t = mean/SE >= T_MIN;
- the noise target is the interval's half-width: a point whose interval is wider than `noise_target` is
  re-measured (more samples, Pinpoint's "more attempts when unknown"), and if it stays wide its verdict is
  "unknown", never "regression";
- a regression also needs the change beyond the magnitude floor (FLOOR, 2%), so a real but tiny change passes.
Kolmogorov-Smirnov and Mann-Whitney p-values of the two sides (Pinpoint's pair of tests, unpaired) are reported
too, as a check on the paired view.

Pure statistics on lists of floats: the GPU part is scripts/nightly_paired.py.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence

from . import stats as S

NOISE_TARGET = 0.005  # half-width of the change's 95% interval that a verdict needs (relative)
MIN_PAIRS = 10


@dataclass
class PairedVerdict:
    n_pairs: int
    ref_median_us: Optional[float]
    cand_median_us: Optional[float]
    change: Optional[float]  # exp(median ln(c/r)) - 1; positive = candidate slower
    ci_low: Optional[float]
    ci_high: Optional[float]
    half_width: Optional[float]  # noise: half the interval's width
    t: Optional[float]  # mean(d) / (sd(d) / sqrt(n))
    p_wilcoxon: Optional[float]
    p_mwu: Optional[float]
    p_ks: Optional[float]
    verdict: str  # regression | improvement | unchanged | unknown
    why: str

    def as_dict(self) -> dict:
        return asdict(self)


def pairs(ref: Sequence[float], cand: Sequence[float]) -> List[float]:
    """ln(c_i / r_i) over the pairs both sides kept (positive samples only)."""
    return [math.log(c / r) for r, c in zip(ref, cand) if r > 0 and c > 0]


def decide(ref: Sequence[float], cand: Sequence[float], floor: float = S.FLOOR, alpha: float = S.ALPHA,
           t_min: float = S.T_MIN, noise_target: float = NOISE_TARGET) -> PairedVerdict:
    d = pairs(ref, cand)
    n = len(d)
    rm, cm = S.median(ref), S.median(cand)
    if n < MIN_PAIRS:
        return PairedVerdict(n, rm, cm, None, None, None, None, None, None, None, None, "unknown",
                             "{} pairs, {} needed".format(n, MIN_PAIRS))
    md = S.median(d)
    lo, hi = S.median_ci(d)
    change, ci_lo, ci_hi = math.exp(md) - 1.0, math.exp(lo) - 1.0, math.exp(hi) - 1.0
    half = (ci_hi - ci_lo) / 2.0
    mean, sd = S.mean_sd(d)
    t = mean / (sd / math.sqrt(n)) if sd > 0 else (0.0 if mean == 0 else math.copysign(math.inf, mean))
    p_w = S.wilcoxon_signed_rank(d)
    p_u = S.mann_whitney_u(ref, cand)
    p_ks = S.ks_2samp(ref, cand)
    mk = lambda verdict, why: PairedVerdict(n, rm, cm, change, ci_lo, ci_hi, half, t, p_w, p_u, p_ks, verdict, why)
    if half > noise_target:
        return mk("unknown", "noisy: ±{:.2f}% > ±{:.2f}% target".format(100 * half, 100 * noise_target))
    significant = p_w < alpha and abs(t) >= t_min
    if abs(change) <= floor:
        return mk("unchanged", "within the {:.1f}% floor".format(100 * floor))
    if not significant:
        return mk("unknown", "beyond the floor but not significant (t={:.1f}, p={:.2g})".format(t, p_w))
    return mk("regression" if change > 0 else "improvement", "t={:.1f}, p={:.2g}".format(t, p_w))


def needs_more(v: PairedVerdict) -> bool:
    """Whether another, longer attempt could decide this point (Pinpoint: more attempts when unknown)."""
    return v.verdict == "unknown"
