"""The words a verdict uses for what a trip record says the probe found (pure).

One function, :func:`trip_words`, turns a trip record into text, so that when trip records
name their cause (the output cap or the context window), only this module learns the
words. A record that names no cause (every record written so far) reads as it always has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from probe.reader.evidence import CAUSE_WORDS
from probe.runtime.contract import PATHOLOGY


@dataclass(frozen=True)
class TripWords:
    """What a verdict says of a trip: ``reason`` (the start of the verdict's reason),
    ``cause`` (the table's cause cell), ``finding`` (what the model did) and ``ended``
    (how the generations it observed ended, with ``{caps}`` for the caps seen)."""

    reason: str
    cause: str
    finding: str
    ended: str


def trip_words(record: Mapping[str, Any] | None) -> TripWords:
    """The words for ``record`` (a trip record, or None when only a results file's evidence
    is at hand): its ``pathology`` and, when the record names one, its ``cause``."""
    pathology = (record or {}).get("pathology") or PATHOLOGY
    cause = (record or {}).get("cause")
    named = CAUSE_WORDS.get(cause) if isinstance(cause, str) else None
    ended = f"ended at the {named}" + (" ({caps})" if cause == "output_cap" else "") if named else (
        "ended at the max_tokens cap ({caps}) or by repetition")  # fmt: skip
    return TripWords(
        reason=f"generation pathology: {pathology}",
        cause="non-termination: cut short" if named is None else f"{named}: cut short",
        finding="the model does not stop" if named is None else f"generations ran to the {named}",
        ended=ended,
    )
