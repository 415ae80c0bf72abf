"""The probe's evidence as lm-eval's results file carries it (pure).

It gives each task's figures, the tasks a trip cut short, and what a score made of cut-off answers
is worth. See docs/evidence.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from probe.reader.documents import Unreadable
from probe.runtime.core.contract import EVIDENCE_KEY, SCHEMA_VERSION
from probe.runtime.core.evidence import STOP_REASONS
from probe.runtime.core.sidecar import finite_throughout, is_count

# Above this share of cut-off generations a score carries a caveat (--max-cap-rate).
DEFAULT_MAX_CAP_RATE = 0.05
# When more than this share of a task's answers were empty, the model did not answer.
EMPTY_MAJORITY = 0.5
CAUSE_WORDS = {
    "output_cap": "output cap",
    "context_window": "context window",
    "length": "cap or window",
    "repetition": "repetition",
    "reasoning": "reasoning used up the budget",
    "aborted": "ended by the server",
}
_COUNTS = ("generate_requests", "observations", "cut_off", "empty_answers", "short_circuited", "cancelled_in_flight")


def run_evidence(document: dict[str, Any]) -> dict[str, Any] | None:
    """The evidence entry of a results document; None when the run was not probed.

    Raises :class:`Unreadable` when the entry is there but cannot be trusted: whether the
    run was cut short then cannot be told.
    """
    if EVIDENCE_KEY not in document:
        return None
    evidence = document[EVIDENCE_KEY]
    version = evidence.get("schema_version") if isinstance(evidence, dict) else None
    if type(version) is not int or version != SCHEMA_VERSION:  # not true, not 1.0
        raise Unreadable(f"the probe's evidence ({EVIDENCE_KEY!r}) is not a schema-{SCHEMA_VERSION} object")
    tasks = evidence.get("tasks")
    if not isinstance(tasks, dict) or not isinstance(evidence.get("tripped"), bool):
        raise Unreadable("the probe's evidence has no 'tasks' object or no 'tripped' flag")
    if not finite_throughout(evidence):
        raise Unreadable("the probe's evidence holds a number that is not finite (NaN, Infinity, or beyond a float)")
    for name, figures in [*tasks.items(), ("(unattributed)", evidence.get("unattributed"))]:
        if figures is None and name == "(unattributed)":
            continue
        problem = _figures_problem(figures)
        if not problem and name != "(unattributed)":
            # Unattributed generations are those whose task could not be told: never asked for as such.
            problem = _requests_problem(figures)
        if not problem and figures["tripped"] and not evidence["tripped"]:
            problem = "is marked tripped while the run's evidence says nothing tripped: the evidence contradicts itself"
        if problem:
            raise Unreadable(f"the probe's evidence for task {name!r} {problem}")
    if evidence["tripped"] and not _any_tripped(evidence):
        # The runtime marks the run tripped only when a group tripped, and a group that
        # tripped has observations filed under a task or as unattributed.
        raise Unreadable("the probe's evidence says the run tripped, yet marks no task (nor unattributed requests) as "
                         "tripped: the evidence contradicts itself")  # fmt: skip
    return evidence


def _any_tripped(evidence: dict[str, Any]) -> bool:
    unattributed = evidence.get("unattributed")
    return any(f["tripped"] for f in evidence["tasks"].values()) or bool(unattributed and unattributed["tripped"])


def _figures_problem(figures: Any) -> str | None:
    if not isinstance(figures, dict) or not isinstance(figures.get("tripped"), bool):
        return "is not an object with a 'tripped' flag"
    for name in _COUNTS:
        value = figures.get(name)
        if not is_count(value):
            return f"has no count {name!r}"
    for name in ("causes", "finish_reasons"):
        counts = figures.get(name)
        if not isinstance(counts, dict) or not all(map(is_count, counts.values())):
            return f"has no counts {name!r}"
    caps = figures.get("max_tokens")
    if not isinstance(caps, list) or any(type(m) is not int for m in caps):
        return "has no list of max_tokens"
    problem = _flagged_problem(figures) or _watched_problem(figures) or _parts_problem(figures)
    if problem:
        return problem
    if figures["cut_off"] > figures["observations"] or figures["empty_answers"] > figures["observations"]:
        return "counts more cut-off or empty answers than observations"
    if figures["cancelled_in_flight"] > figures["short_circuited"]:
        return "counts more requests cancelled in flight than answered blank"
    if figures["short_circuited"] and not figures["tripped"]:
        return (f"says {figures['short_circuited']} of its answers were blanked by the probe, yet its 'tripped' "
                "flag is false: the evidence contradicts itself")  # fmt: skip
    return None


def _parts_problem(figures: dict[str, Any]) -> str | None:
    """Why counts that are parts of others do not add up, or None.

    The parts are those ``TaskEvidence`` files: observations by finish reason, and cut-off
    generations by cause. They also include stops at the cap, and generations below MIN_MAX_TOKENS
    or under an unknown budget. Older evidence may lack some counts. See
    docs/reading.md.
    """
    observed, reasons, causes = figures["observations"], figures["finish_reasons"], figures["causes"]
    if sum(reasons.values()) != observed or sum(causes.values()) != figures["cut_off"]:
        return ("counts finish reasons other than its observations, or causes other than its cut-off "
                "generations: the evidence contradicts itself")  # fmt: skip
    stops = min(sum(reasons.get(reason, 0) for reason in STOP_REASONS), causes.get("output_cap", 0))
    for name, most in (("stop_at_cap", stops), ("below_min_max_tokens", observed), ("unknown_budget", observed)):
        value = figures.get(name, 0)
        if not is_count(value) or value > most:
            return f"has a count {name!r} that is not within its observations: the evidence contradicts itself"
    if figures.get("below_min_max_tokens", 0) + figures.get("unknown_budget", 0) > observed:
        return ("counts more generations below MIN_MAX_TOKENS or under an unknown budget than it observed: "
                "the evidence contradicts itself")  # fmt: skip
    return None


def _requests_problem(figures: dict[str, Any]) -> str | None:
    """Why a task's generations do not add up, or None.

    Each generation is asked for once. It is either observed (flagged, or cut short by a trip) or a
    blank answer, never both.
    """
    answered = figures["observations"] + figures["short_circuited"]
    if answered > figures["generate_requests"] or figures.get("flagged", 0) > answered:
        return ("counts more generations observed or answered blank than it asked for, or more flagged "
                "than it observed or answered blank: the evidence contradicts itself")  # fmt: skip
    return None


def _flagged_problem(figures: dict[str, Any]) -> str | None:
    """The loop detector's figures (absent from evidence written before it): a count, and the
    endings of at most that many flagged generations."""
    if "flagged" not in figures and "flagged_endings" not in figures:
        return None
    flagged, endings = figures.get("flagged"), figures.get("flagged_endings")
    if not is_count(flagged):
        return "has no count 'flagged'"
    if not isinstance(endings, dict) or not all(map(is_count, endings.values())):
        return "has no counts 'flagged_endings'"
    if sum(endings.values()) > flagged:
        return "records the endings of more flagged generations than were flagged: the evidence contradicts itself"
    # A flagged generation's ending is filed as every ending is, under its finish reason too.
    reasons = figures["finish_reasons"]
    if any(count > reasons.get(label, 0) for label, count in endings.items()):
        return "records flagged endings its finish reasons do not hold: the evidence contradicts itself"
    cut, proved = figures.get("flagged_cut_off", 0), figures.get("false_flags", 0)
    if not (is_count(cut) and is_count(proved) and cut + proved <= sum(endings.values()) and cut <= figures["cut_off"]):
        return ("counts flagged generations cut off or proved wrong beyond those that ended, or beyond the "
                "cut-off ones: the evidence contradicts itself")  # fmt: skip
    return None


def _watched_problem(figures: dict[str, Any]) -> str | None:
    """Why the count the loop detector read is wrong, or None.

    It must lie within the observations. It must be no fewer than the flagged generations that then
    ended. Older evidence may lack it.
    """
    if "watched" not in figures:
        return None
    watched = figures["watched"]
    if not is_count(watched):
        return "has no count 'watched'"
    ended_flagged = sum((figures.get("flagged_endings") or {}).values())
    if not ended_flagged <= watched <= figures["observations"]:
        return ("counts more generations the loop detector read than were observed, or fewer than it "
                "flagged and then saw end: the evidence contradicts itself")  # fmt: skip
    return None


def blanked_unattributed(evidence: dict[str, Any] | None) -> bool:
    """Whether the probe blanked requests whose task it could not tell (``unattributed``)."""
    unattributed = (evidence or {}).get("unattributed")
    return bool(unattributed and (unattributed["tripped"] or unattributed["short_circuited"]))


def summed(all_figures: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The figures of several tasks added up (a group's); None when there are none."""
    if not all_figures:
        return None
    total: dict[str, Any] = {name: sum(f[name] for f in all_figures) for name in _COUNTS}
    for name in ("causes", "finish_reasons"):
        counts: dict[str, int] = {}
        for figures in all_figures:
            for key, value in figures[name].items():
                counts[key] = counts.get(key, 0) + value
        total[name] = counts
    total["stop_at_cap"] = sum(f.get("stop_at_cap", 0) for f in all_figures)
    if any("flagged" in f for f in all_figures):
        total["flagged"] = sum(f.get("flagged", 0) for f in all_figures)
        endings: dict[str, int] = {}
        for figures in all_figures:
            for key, value in (figures.get("flagged_endings") or {}).items():
                endings[key] = endings.get(key, 0) + value
        total["flagged_endings"] = endings
    if all(counts_flagged_endings(f) for f in all_figures):  # one rule for every task, or none
        for name in ("false_flags", "flagged_cut_off"):
            total[name] = sum(f[name] for f in all_figures)
    if all("watched" in f for f in all_figures):  # a sum over some tasks only would undercount
        total["watched"] = sum(f["watched"] for f in all_figures)
    total["max_tokens"] = sorted({m for f in all_figures for m in f["max_tokens"]})
    total["tripped"] = any(f["tripped"] for f in all_figures)
    return total


def counts_flagged_endings(figures: Mapping[str, Any]) -> bool:
    """Whether the evidence counts how its flagged generations ended by today's rule: the flags the
    model proved wrong (``false_flags``) and those cut off (``flagged_cut_off``). Older evidence
    lacks ``flagged_cut_off``, and counted ``false_flags`` by other rules."""
    return is_count(figures.get("flagged_cut_off")) and is_count(figures.get("false_flags"))


def cause_text(figures: dict[str, Any]) -> str:
    """The causes of the cut-off generations, e.g. "12 output cap, 3 context window"."""
    parts = [f"{count} {CAUSE_WORDS.get(cause, cause)}" for cause, count in figures["causes"].items() if count]
    return ", ".join(parts) or "none"


def caveat(
    figures: dict[str, Any], score: float | None, higher_is_better: bool, max_cap_rate: float, force: bool = False
) -> dict[str, Any] | None:
    """The caveat of a score when more than ``max_cap_rate`` of its generations were cut off.

    With ``force``, any cut-off generation gives one: a group whose task carries a caveat carries
    one too. The bound is the score had every cut-off answer been right. It is None when there is no
    score, or the score is not a proportion. See docs/reading.md.
    """
    observed, cut = figures["observations"], figures["cut_off"]
    if not observed or not cut or (cut / observed <= max_cap_rate and not force):
        return None
    bound = None
    if score is not None and 0.0 <= score <= 1.0:
        bound = min(1.0, score + cut / observed) if higher_is_better else max(0.0, score - cut / observed)
    side = "a lower" if higher_is_better else "an upper"
    text = f"the score is {side} bound: {cut} of {observed} generations were cut off ({cause_text(figures)})" + (
        f"; had every cut-off answer been right it would be {bound:.4g}" if bound is not None else ""
    )
    return {"cut_off": cut, "observations": observed, "causes": dict(figures["causes"]), "bound": bound, "text": text}


def silence(figures: dict[str, Any]) -> str | None:
    """ "The model did not answer", with the evidence, when most answers were empty."""
    observed, empty = figures["observations"], figures["empty_answers"]
    if not observed or empty / observed <= EMPTY_MAJORITY:
        return None
    reasons = ", ".join(f"{k}={v}" for k, v in figures.get("finish_reasons", {}).items())
    return f"the model did not answer: {empty} of {observed} answers were empty (finish reasons: {reasons})"


def cap_rate(figures: dict[str, Any] | None) -> float | None:
    """The share of a task's generations that were cut off; None when none was observed."""
    if not figures or not figures["observations"]:
        return None
    rate = figures["cut_off"] / figures["observations"]
    return rate if math.isfinite(rate) else None
