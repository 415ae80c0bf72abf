"""Reading scores: a measured 0.0 is a measurement; NaN, inf and non-numbers are not."""

from __future__ import annotations

import math
from numbers import Real


def finite_score(value: object) -> float | None:
    """``value`` as a float when it is a finite real number (0.0 included), else None.

    Booleans, strings, None, NaN, +/-inf and numbers too large for a float are all None. A score is
    only what lm-eval measured, never something coerced into one.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        return None
    try:
        result = float(value)
    except OverflowError:  # a JSON integer of hundreds of digits: finite there, not as a score
        return None
    return result if math.isfinite(result) else None


def accuracy_meets_floor(score: float, floor: float, higher_is_better: bool = True) -> bool:
    """Whether a finite ``score`` is usable against ``floor`` (inclusive)."""
    return score >= floor if higher_is_better else score <= floor
