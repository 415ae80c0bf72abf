"""The words a verdict uses for what a trip record says the probe found (pure).

One function, :func:`trip_words`, turns a trip record into text, so that when trip records
name their cause (the output cap or the context window), only this module learns the
words. A record that names no cause (every record written so far) reads as it always has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from probe.reader.evidence import CAUSE_WORDS, counts_flagged_endings
from probe.runtime.core.contract import PATHOLOGY, cause_words
from probe.runtime.core.evidence import ended_by_model


@dataclass(frozen=True)
class TripWords:
    """What a verdict says of a trip.

    ``reason`` starts the verdict's reason. ``cause`` is the table's cause cell. ``finding`` says
    what the model did. ``ended`` says how the observed generations ended, with ``{caps}`` for the
    caps seen. ``advice`` says what to change, None for a record that names no cause.
    """

    reason: str
    cause: str
    finding: str
    ended: str
    advice: str | None = None


def trip_words(record: Mapping[str, Any] | None) -> TripWords:
    """The words for ``record``, a trip record, or None when only a results file's evidence is at
    hand.

    They describe its ``pathology`` and, when named, its ``cause``. The words are the runtime's
    glossary's (``probe.runtime.core.contract.cause_words``).
    """
    pathology = (record or {}).get("pathology") or PATHOLOGY
    cause = (record or {}).get("cause")
    reason = f"generation pathology: {pathology}"
    if not isinstance(cause, str) or cause not in CAUSE_WORDS:
        # Records written before trips named their cause read as they always have.
        return TripWords(reason, "non-termination: cut short", "the model does not stop",
                         "ended at the max_tokens cap ({caps}) or by repetition")  # fmt: skip
    what, advice = cause_words(cause)
    return TripWords(
        reason, f"{CAUSE_WORDS[cause]}: cut short", f"generations {what}", what + " (max_tokens {caps})", advice
    )


def flagged_words(figures: Mapping[str, Any] | None) -> str | None:
    """The loop detector's line for a task's or group's evidence.

    It says how many generations it read as they came, how many it flagged, and how those then
    ended. That is its precision on this run. None when it read and flagged none, or the evidence
    predates it.
    """
    flagged, watched = (figures or {}).get("flagged"), (figures or {}).get("watched")
    read = (
        f"it read {watched} of the {_count(figures, 'observations')} generations observed as they came"
        if type(watched) is int
        else None
    )
    if type(flagged) is not int or flagged <= 0:
        # Flagged none: of how many it read (none at all when nothing was streamed) says what that is worth.
        return f"loop detector: no generation flagged; {read}" if read and type(flagged) is int else None
    endings = (figures or {}).get("flagged_endings") or {}
    ended = sum(endings.values())
    said = ", ".join(f"{reason}={count}" for reason, count in sorted(endings.items()))
    stops = sum(count for reason, count in endings.items() if ended_by_model(reason))
    proved = figures["false_flags"] if figures and counts_flagged_endings(figures) else None
    if proved is not None and proved <= stops:  # the evidence says which flagged stops the model proved wrong
        at_cap, least, were = stops - proved, "", f"{stops - proved} of the stops were"
    else:  # older evidence: a server that hides the cap reports it as a stop (``stop_at_cap``)
        at_cap = min(stops, _count(figures, "stop_at_cap"))
        least, were = ("at least " if at_cap else ""), f"up to {at_cap} of the stops may be"
    then = f"{ended} of them then ended ({said})" if ended else "none of them had ended (those a trip cancels never do)"
    if stops - at_cap:
        then += f"; {least}{stops - at_cap} stopped by themselves (flags the model proved wrong, or loops it left)"
    if at_cap:
        then += f"; {were} at the budget's end, which this server reports as a stop (not a flag proved wrong)"
    line = f"loop detector: {flagged} generations flagged looping before they ended; " + then
    return f"{line}; {read}" if read else line


def _count(figures: Mapping[str, Any] | None, name: str) -> int:
    value = (figures or {}).get(name)
    return value if type(value) is int and value > 0 else 0
