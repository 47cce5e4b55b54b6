"""Statistics of the regression gate: unpaired compare, the paired gate's tests, and change points in history.

Anchors, and what each contributes:
- Perfherder (Mozilla): a change counts only beyond a magnitude floor (2%) AND at t >= 7, a t statistic against
  the run-to-run noise. Here: FLOOR and T_MIN.
- Pinpoint (Chromium): two builds timed on one machine, interleaved; Kolmogorov-Smirnov and Mann-Whitney tests;
  a comparison that cannot decide gets more attempts, and stays "unknown" rather than guessing. Here: the paired
  gate (paired.py) re-measures noisy or undecided points and reports KS and U p-values next to its paired tests.
- Apache Otava / Hunter (E-Divisive means): change points in a series, each confirmed by a t-test over at most 50
  runs either side. Here: change_points(), binary segmentation with a windowed Welch t (window 50).

Unpaired compare (two results files) cannot tell a code change from host-to-host drift by the samples alone: with
~1000 samples a side the U test's p-value is ~0 for any steady offset. So a regression also needs the change to
stand T_MIN times clear of the between-run spread: learned from history for that GPU model and point where there
is history, else from the pair itself (the spread of per-point changes), and never assumed where the two files
come from different hosts (then compare asks for a paired run). A point that missed its noise target in either run
is "unknown" beyond the floor, never a regression on its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

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


# Defaults of the gate, each from an anchor (docs in the module docstring).
FLOOR = 0.02  # the smallest change the gate acts on (Perfherder: 2%)
T_MIN = 7.0  # a change must be this many standard deviations of its noise clear of zero (Perfherder: t >= 7)
ALPHA = 0.05  # significance level of the rank tests (Mann-Whitney U; the paired gate's Wilcoxon)
# Fewer clean points than this and the spread of one pair's per-point changes says nothing about the host-to-host
# spread; the measurement noise alone is used then.
MIN_POINTS_FOR_RUN_SPREAD = 8
# Relative standard error of a median = this x relative stdev / sqrt(n) (normal samples: sqrt(pi / 2)).
MEDIAN_SE_FACTOR = 1.2533


def median_rel_se(samples: Sequence[float], cv: Optional[float]) -> Optional[float]:
    """Relative standard error of a run's median from its samples (or its cv and sample count)."""
    n = len(samples)
    if n < 2:
        return None
    c = cv if cv is not None else rel_stdev(samples)
    return None if c is None else MEDIAN_SE_FACTOR * c / math.sqrt(n)


def run_spread(log_ratios: Sequence[float]) -> Optional[float]:
    """The between-run spread learned from one pair of runs: the robust standard deviation of ln(current/baseline)
    over the points that met their noise target in both. What every point of the pair shares (a slower host, a
    different clock) moves them together and shows in the centre, not the spread; what differs point to point
    (host-to-host drift of one kernel) is the spread. None under MIN_POINTS_FOR_RUN_SPREAD points."""
    if len(log_ratios) < MIN_POINTS_FOR_RUN_SPREAD:
        return None
    return mad_sigma(log_ratios)


@dataclass
class Change:
    base_us: float
    cur_us: float
    change: float  # cur / base - 1 (positive = slower)
    p_value: Optional[float]  # Mann-Whitney U; None when it could not run
    noise: Optional[float]  # measurement noise: relative standard error of the difference of the two medians
    spread: Optional[float]  # the between-run spread used (std of ln ratio), None if none was known
    z: Optional[float]  # ln(cur / base) over max(spread, noise)
    verdict: str  # regression | improvement | unchanged | unknown | needs paired run
    why: str  # one short phrase for the table


def decide(base_us: float, cur_us: float, base_samples: Sequence[float], cur_samples: Sequence[float],
           base_cv: Optional[float], cur_cv: Optional[float], threshold: float = FLOOR, alpha: float = ALPHA,
           base_noisy: bool = False, cur_noisy: bool = False, spread: Optional[float] = None,
           spread_from: str = "", needs_spread: bool = False, z_min: float = T_MIN) -> Change:
    """Verdict on one point of two unpaired runs.

    A regression needs all of: a slowdown beyond `threshold`; both runs met their noise target (else "unknown": a
    noisy point never decides alone); ln(cur/base) at least z_min x the larger of the between-run `spread`
    (history's, or the pair's own) and the two medians' measurement noise; and, with samples, a Mann-Whitney U
    p-value under alpha. `needs_spread`: the runs come from different hosts, so without a learned spread a change
    beyond the threshold gets "needs paired run", not a verdict."""
    change = cur_us / base_us - 1.0
    p = None
    ses = [v for v in (median_rel_se(base_samples, base_cv), median_rel_se(cur_samples, cur_cv)) if v is not None]
    noise = math.sqrt(sum(v * v for v in ses)) if len(ses) == 2 else None
    mk = lambda verdict, why, z=None: Change(base_us, cur_us, change, p, noise, spread, z, verdict, why)  # reads p when called

    if abs(change) <= threshold:
        return mk("unchanged", "within the {:.1f}% floor".format(100 * threshold))
    if base_noisy or cur_noisy:
        which = "both runs" if base_noisy and cur_noisy else ("baseline" if base_noisy else "current")
        return mk("unknown", "noise target missed in {}: re-measure (paired run)".format(which))
    if spread is None and needs_spread:
        return mk("needs paired run", "different hosts and no learned spread")
    # Only now: the U test costs more than everything else here, and a point inside the floor never needs it.
    if len(base_samples) >= MIN_SAMPLES_FOR_UTEST and len(cur_samples) >= MIN_SAMPLES_FOR_UTEST:
        p = mann_whitney_u(base_samples, cur_samples)
    sigmas = [v for v in (spread, noise) if v is not None and v > 0]
    if not sigmas:
        if p is not None and p >= alpha:
            return mk("unchanged", "not significant (p={:.2g})".format(p))
        return mk("regression" if change > 0 else "improvement", "no samples or noise estimate: threshold only")
    sigma = max(sigmas)
    z = math.log(cur_us / base_us) / sigma
    src = "{} spread {:.2f}%".format(spread_from or "between-run", 100 * spread) if spread is not None and \
        sigma == spread else "measurement noise {:.2f}%".format(100 * sigma)
    if abs(z) < z_min:
        return mk("unchanged", "|z|={:.1f} < {:g} ({})".format(abs(z), z_min, src), z)
    if p is not None and p >= alpha:
        return mk("unchanged", "not significant (p={:.2g})".format(p), z)
    why = "z={:.1f} ({})".format(z, src) + ("" if p is None else ", p={:.2g}".format(p))
    return mk("regression" if change > 0 else "improvement", why, z)


# ---------------------------------------------------------------------------------------------------------------
# Robust spread, paired tests and the Kolmogorov-Smirnov test (Pinpoint's pair: KS and Mann-Whitney).
# Own implementations so that a GPU runner without scipy can decide; scipy, where installed, is only cross-checked in
# the tests, so both paths give the same verdicts.

MAD_TO_SIGMA = 1.4826  # MAD x this estimates the standard deviation of a normal distribution


def mad_sigma(xs: Sequence[float]) -> Optional[float]:
    """Robust standard deviation: 1.4826 x the median absolute deviation from the median (None under 2 values)."""
    if len(xs) < 2:
        return None
    m = median(xs)
    return MAD_TO_SIGMA * median([abs(x - m) for x in xs])


def mean_sd(xs: Sequence[float]):
    n = len(xs)
    m = sum(xs) / n
    var = sum((v - m) ** 2 for v in xs) / (n - 1) if n > 1 else 0.0
    return m, math.sqrt(var)


def normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def wilcoxon_signed_rank(d: Sequence[float]) -> float:
    """Two-sided p-value of the Wilcoxon signed-rank test that the paired differences d are centred on 0 (zeros
    dropped, normal approximation with tie and continuity correction: scipy's zero_method='wilcox',
    correction=True, method='approx')."""
    nz = [v for v in d if v != 0]
    n = len(nz)
    if n == 0:
        return 1.0
    ranks, ties = _rank([abs(v) for v in nz])
    w_plus = sum(r for r, v in zip(ranks, nz) if v > 0)
    mu = n * (n + 1) / 4.0
    var = n * (n + 1) * (2 * n + 1) / 24.0 - ties / 48.0
    if var <= 0:
        return 1.0
    z = (abs(w_plus - mu) - 0.5) / math.sqrt(var)
    if z <= 0:
        return 1.0
    return min(1.0, 2.0 * normal_sf(z))


def _kolmogorov_sf(x: float) -> float:
    """P(K > x) of the Kolmogorov distribution (the limit of sqrt(n) x the KS statistic)."""
    if x <= 0:
        return 1.0
    if x < 1.18:  # the theta-function form converges fast here, the alternating series does not
        y = math.exp(-math.pi ** 2 / (8 * x * x))
        s = sum(y ** ((2 * k - 1) ** 2) for k in range(1, 8))
        return max(0.0, 1.0 - math.sqrt(2 * math.pi) / x * s)
    return min(1.0, max(0.0, 2.0 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * x * x) for k in range(1, 101))))


def ks_2samp(x: Sequence[float], y: Sequence[float]) -> float:
    """Two-sided p-value of the two-sample Kolmogorov-Smirnov test (asymptotic distribution)."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        return 1.0
    xs, ys = sorted(x), sorted(y)
    i = j = 0
    d = 0.0
    while i < n1 and j < n2:
        v = min(xs[i], ys[j])
        while i < n1 and xs[i] == v:
            i += 1
        while j < n2 and ys[j] == v:
            j += 1
        d = max(d, abs(i / n1 - j / n2))
    en = math.sqrt(n1 * n2 / (n1 + n2))
    return _kolmogorov_sf(en * d)


def median_ci(xs: Sequence[float], z: float = 1.96):
    """Distribution-free confidence interval of the median from order statistics (the sign test's), about 95% for
    z = 1.96. (lo, hi); the whole range under 6 values."""
    s = sorted(xs)
    n = len(s)
    k = int(math.floor(n / 2.0 - z * math.sqrt(n) / 2.0))
    if k < 0 or n < 6:
        return s[0], s[-1]
    return s[k], s[n - 1 - k]



# ---------------------------------------------------------------------------------------------------------------
# Change points in a series (history): binary segmentation with a windowed t-test, as Otava/Hunter confirm an
# E-Divisive split. Values are ln(median) per run; the t statistic's noise is the robust run-to-run spread (from
# successive differences) of the whole series or of either side, whichever is largest, so that a few nearly
# identical runs either side cannot make a tiny step "significant".

CP_WINDOW = 50  # runs either side of a candidate split that its t-test sees (Otava's window)
CP_MIN_SIZE = 3  # runs either side at least: a single outlier run is not a change


def series_spread(values: Sequence[float]) -> Optional[float]:
    """Robust run-to-run standard deviation of a series, from its successive differences (MAD / sqrt 2): a level
    shift moves one difference only, so change points barely inflate it. None under 3 values."""
    if len(values) < 3:
        return None
    d = mad_sigma([b - a for a, b in zip(values, values[1:])])
    return None if d is None else d / math.sqrt(2.0)


def _split_t(values: Sequence[float], s: int, lo: int, hi: int, floor_sd: float, window: int,
             per_side: bool = True) -> float:
    """Welch-style t of the means either side of split s, within `window` runs, with the noise taken from
    successive differences (series_spread) rather than each side's plain sd: a side that holds another level shift
    would otherwise inflate its sd and hide the split (a rise then a fall). per_side: the noise is also at least
    either side's own spread (the confirmation); without it, the whole series' (locating the split, where a noise
    that moves with the split would move the maximum off the step)."""
    left = values[max(lo, s - window):s]
    right = values[s:min(hi, s + window)]
    nl, nr = len(left), len(right)
    sides = [v for v in (series_spread(left), series_spread(right)) if v is not None] if per_side else []
    sd = max([floor_sd] + sides)
    if sd <= 0:
        return 0.0
    return (sum(right) / nr - sum(left) / nl) / (sd * math.sqrt(1.0 / nl + 1.0 / nr))


def change_points(values: Sequence[float], t_min: float = T_MIN, min_shift: float = FLOOR,
                  window: int = CP_WINDOW, min_size: int = CP_MIN_SIZE) -> List[int]:
    """Indices i where the series' level changes between values[i-1] and values[i] (values: ln of the medians, in
    run order). A split is kept when its windowed t is at least t_min and the level moved by at least min_shift
    (relative); the segments either side are then searched again. Sorted."""
    floor_sd = series_spread(values) or 0.0
    found: List[int] = []

    def search(lo: int, hi: int) -> None:
        best, best_t = None, 0.0
        for s in range(lo + min_size, hi - min_size + 1):
            t = _split_t(values, s, lo, hi, floor_sd, window, per_side=False)
            if abs(t) > abs(best_t):
                best, best_t = s, t
        if best is None or abs(_split_t(values, best, lo, hi, floor_sd, window)) < t_min:
            return
        left = values[max(lo, best - window):best]
        right = values[best:min(hi, best + window)]
        shift = math.exp(median(right) - median(left)) - 1.0
        if abs(shift) < min_shift:
            return
        found.append(best)
        search(lo, best)
        search(best, hi)

    search(0, len(values))
    return sorted(found)


def segments(n: int, cps: Sequence[int]):
    """[(begin, end)] of the runs between change points."""
    bounds = [0] + list(cps) + [n]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]
