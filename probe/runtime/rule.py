"""The trip rule: enough observations, and enough of them pathological (pure)."""

from __future__ import annotations

# Streamed evidence is worth its cost while the pathological share is at least this fraction of
# the trip ratio (see verdict_open).
REACH = 0.5
# The fewest observations whose share may close the verdict, whatever MIN_SAMPLES says: healthy
# answers that end soon come back before the loops streamed beside them are flagged, and with
# MIN_SAMPLES=1 a single early stop closed it while the slow start let a whole wave out unstreamed
# (a model looping on 80% of prompts then tripped on the cap, not on its loops).
CLOSE_AFTER = 16


def rule_fires(observed: int, pathological: int, min_samples: int, length_ratio: float) -> bool:
    """True once ``observed >= min_samples`` and ``pathological >= length_ratio * observed``.

    Never without a single pathological observation, whatever the ratio.
    """
    if observed < min_samples or observed <= 0 or pathological <= 0:
        return False
    # A small tolerance so that, say, 7 of 10 meets a ratio of 0.7 despite float rounding.
    return pathological >= length_ratio * observed - 1e-9


def verdict_open(observed: int, pathological: int, min_samples: int, length_ratio: float, pending: int = 0) -> bool:
    """Whether the rule's verdict is still open: fewer than ``min_samples`` (and than
    ``CLOSE_AFTER``) observed, or, counting each of the ``pending`` generations in flight whose
    outcome is not counted yet as pathological, a share of at least ``REACH`` of the ratio, or
    one more pathological observation would fire the rule.

    Pending means streamed or not: sent unstreamed, a loop shows only at the cap; streamed, only
    once the detector has read enough of it, long after a healthy answer beside it has ended.
    Counting them all keeps the early stops from closing the verdict on the loops in flight.

    A closed verdict cannot fire before it reopens, whatever the pending generations turn out
    to be: not on the next observation, and on the way to a trip the share climbs past
    ``REACH * length_ratio``, where it is open again.
    """
    if observed < max(min_samples, CLOSE_AFTER):
        return True
    observed, pathological = observed + pending, pathological + pending
    if pathological >= REACH * length_ratio * observed - 1e-9:
        return True
    return rule_fires(observed + 1, pathological + 1, min_samples, length_ratio)
