"""Noise-aware change detection between two runs of one point.

A point regressed only if (1) its median slowed by more than `threshold` AND (2) the slowdown is
statistically real: the two sample sets differ by a Mann-Whitney U test at `alpha` AND the change is
larger than either run's own noise (nvbench's rule: relative difference beyond the larger relative
standard deviation). Requiring both keeps nightly CI quiet on noisy points; with only the noise
estimate (no samples, e.g. an older file) the noise rule decides alone; with neither, the threshold
decides and the verdict says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

# Below this many samples per side a U test cannot reach alpha = 0.05 reliably; do not pretend.
MIN_SAMPLES_FOR_UTEST = 5


def _rank(values: Sequence[float]):
    """Average ranks (1-based) and the tie-correction term sum(t^3 - t)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties = 0.0
    i = 0
    n = len(values)
    while i < n:
        j = i
        while j + 1 < n and values[order[j + 1]] == values[order[i]]:
            j += 1
        avg = (i + j) / 2.0 + 1.0
        for k in range(i, j + 1):
            ranks[order[k]] = avg
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    return ranks, ties


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, tie and continuity corrected).

    Uses scipy when it is installed (exact distribution for small samples), else our own computation.
    """
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        return 1.0
    try:
        from scipy.stats import mannwhitneyu  # optional
        return float(mannwhitneyu(x, y, alternative="two-sided").pvalue)
    except ImportError:
        pass
    return _mann_whitney_u_normal(x, y)


def _mann_whitney_u_normal(x: Sequence[float], y: Sequence[float]) -> float:
    n1, n2 = len(x), len(y)
    ranks, ties = _rank(list(x) + list(y))
    r1 = sum(ranks[:n1])
    u1 = r1 - n1 * (n1 + 1) / 2.0
    mu = n1 * n2 / 2.0
    n = n1 + n2
    var = n1 * n2 / 12.0 * ((n + 1) - ties / (n * (n - 1)))
    if var <= 0:
        return 1.0  # every value identical
    z = (abs(u1 - mu) - 0.5) / math.sqrt(var)
    if z <= 0:
        return 1.0
    return min(1.0, math.erfc(z / math.sqrt(2.0)))


def median(xs: Sequence[float]) -> Optional[float]:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return None
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def rel_stdev(xs: Sequence[float]) -> Optional[float]:
    n = len(xs)
    if n < 2:
        return None
    m = sum(xs) / n
    if m == 0:
        return None
    var = sum((v - m) ** 2 for v in xs) / (n - 1)
    return math.sqrt(var) / abs(m)


@dataclass
class Change:
    base_us: float
    cur_us: float
    change: float            # cur / base - 1 (positive = slower)
    p_value: Optional[float]  # None when the U test could not run
    noise: Optional[float]    # max relative stdev of the two runs
    verdict: str              # "regression" | "improvement" | "unchanged"
    why: str                  # one short phrase for the table


def decide(base_us: float, cur_us: float, base_samples: Sequence[float], cur_samples: Sequence[float],
           base_cv: Optional[float], cur_cv: Optional[float], threshold: float, alpha: float) -> Change:
    change = cur_us / base_us - 1.0
    p = None
    if len(base_samples) >= MIN_SAMPLES_FOR_UTEST and len(cur_samples) >= MIN_SAMPLES_FOR_UTEST:
        p = mann_whitney_u(base_samples, cur_samples)
    bcv = base_cv if base_cv is not None else rel_stdev(base_samples)
    ccv = cur_cv if cur_cv is not None else rel_stdev(cur_samples)
    noises = [v for v in (bcv, ccv) if v is not None]
    noise = max(noises) if noises else None

    if abs(change) <= threshold:
        return Change(base_us, cur_us, change, p, noise, "unchanged", "within threshold")
    beyond_noise = noise is None or abs(change) > noise
    if p is not None:
        significant = p < alpha and beyond_noise
        why = "p={:.2g}".format(p) + ("" if beyond_noise else ", within noise")
        if p >= alpha:
            why = "not significant (p={:.2g})".format(p)
    elif noise is not None:
        significant = beyond_noise
        why = "too few samples; " + ("beyond noise" if beyond_noise else "within noise")
    else:
        significant = True
        why = "no samples or noise estimate: threshold only"
    if not significant:
        return Change(base_us, cur_us, change, p, noise, "unchanged", why)
    return Change(base_us, cur_us, change, p, noise, "regression" if change > 0 else "improvement", why)
