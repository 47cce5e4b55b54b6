"""A traffic model against measured DRAM bytes: the one rule that scripts/model_check.py and the report apply.

A record's bytes_model is the model's count; where the regime leaves the count open (a working set near the usable
L2), the record also has bytes_model_range [low, high] and bytes_model_reason says why. A point is
  within     when |measured / bytes_model - 1| <= tolerance;
  explained  when it is not, but the model gives a range and the measured bytes lie in it (each end widened by the
             tolerance): the reason applies;
  outside    otherwise (a reason that does not cover the measurement explains nothing).
"""
from typing import Optional, Sequence

TOLERANCE = 0.15  # |measured / model - 1|
WITHIN, EXPLAINED, OUTSIDE = "within", "explained", "outside"


def model_range(rng) -> Optional[Sequence[float]]:
    """[low, high] from a record's bytes_model_range, or None when absent or malformed."""
    if (isinstance(rng, (list, tuple)) and len(rng) == 2 and all(isinstance(x, (int, float)) for x in rng)
            and 0 <= rng[0] <= rng[1]):
        return rng
    return None


def verdict(measured: float, model: float, rng=None, tolerance: float = TOLERANCE) -> str:
    if model > 0 and abs(measured / model - 1) <= tolerance:
        return WITHIN
    rng = model_range(rng)
    if rng is not None and rng[0] * (1 - tolerance) <= measured <= rng[1] * (1 + tolerance):
        return EXPLAINED
    return OUTSIDE
