"""The trip rule: enough observations, and enough of them pathological (pure)."""

from __future__ import annotations


def rule_fires(observed: int, pathological: int, min_samples: int, length_ratio: float) -> bool:
    """True once ``observed >= min_samples`` and ``pathological >= length_ratio * observed``.

    Never without a single pathological observation, whatever the ratio.
    """
    if observed < min_samples or observed <= 0 or pathological <= 0:
        return False
    # A small tolerance so that, say, 7 of 10 meets a ratio of 0.7 despite float rounding.
    return pathological >= length_ratio * observed - 1e-9
