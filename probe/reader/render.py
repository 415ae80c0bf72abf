"""Verdicts as text (pure).

``describe`` shows one in full. ``table`` shows many, one table per run. ``markdown`` writes a table
for a CI summary such as ``$GITHUB_STEP_SUMMARY``. Everything shown may come from a hostile file, so
control characters and Markdown syntax are escaped. See docs/reading.md.
"""

from __future__ import annotations

import re
import time
from typing import Any

from probe.reader import evidence as ev
from probe.reader.model import Source, Status, Verdict
from probe.reader.words import flagged_words, trip_words

_HEADINGS = ("task", "metric", "score", "status", "cap rate", "cause")


def safe(value: object) -> str:
    """``value`` as text a terminal shows as it is.

    Control characters are written as escapes: a newline cannot forge a table row, nor an escape
    sequence act.
    """
    text = str(value)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def describe(verdict: Verdict) -> str:
    """A human summary of one verdict: status, score, floor, file and run, caveat, evidence."""
    metric = verdict.metric if verdict.metric is not None else "no metric"
    what = f"{metric} of {verdict.task}" if verdict.task is not None else "no task"
    score = "none" if verdict.score is None else f"{verdict.score:g}"
    side = "higher" if verdict.higher_is_better else "lower"
    sidecar = verdict.sidecar
    lines = [
        f"status:  {verdict.status.value} ({verdict.reason})",
        f"score:   {score} ({what}); floor {verdict.floor:g}, {side} is better",
        f"results: {_origin(verdict.source)}",
        f"sidecar: {sidecar.state.value}" + (f" ({sidecar.error})" if sidecar.error else ""),
    ]
    figures = verdict.evidence
    if figures:
        lines.append(
            f"generations: {figures['observations']} observed of {figures['generate_requests']} asked; "
            f"{figures['cut_off']} cut off ({ev.cause_text(figures)}); {figures['empty_answers']} empty answers"
        )
        detector = flagged_words(figures)
        if detector:
            lines.append(detector)
    if verdict.pathology:
        lines.append(pathology_text(verdict.pathology))
    return "\n".join(safe(line) for line in lines)


def pathology_text(found: dict[str, Any]) -> str:
    """The evidence of a trip in one paragraph."""
    words = trip_words(found)
    reasons = ", ".join(f"{k}={v}" for k, v in (found["finish_reasons"] or {}).items())
    flagged = found.get("flagged")
    if type(flagged) is int and flagged > 0:
        reasons = "; ".join(part for part in (reasons, f"{flagged} flagged looping before they ended") if part)
    caps = ", ".join(str(m) for m in found["max_tokens"] or []) or "not recorded"
    if found["short_circuited_requests"] is None:
        after = "The final counters were not written (the process ended before its exit handlers ran)."
    else:
        # The short-circuited requests include those cancelled in flight, which did reach it.
        short, cancelled = found["short_circuited_requests"], found["cancelled_in_flight"]
        never_sent = short - cancelled if type(short) is int and type(cancelled) is int else short
        after = (
            f"{never_sent} requests were then "
            f"answered with empty strings without contacting the server, and {cancelled} in-flight requests "
            "were cancelled."
        )
    when = found["seconds_since_first_request"]
    served = f" at {found['base_url']}" if found.get("base_url") else ""  # none in-process (vLLM, HF)
    where = [
        f"model {found['model']}{served}" if found["model"] else "",
        f"lm-eval {found['lm_eval_version']}" if found["lm_eval_version"] else "",
        f"probe settings {found['settings_fingerprint']}" if found["settings_fingerprint"] else "",
    ]
    context = ", ".join(w for w in where if w)
    return (
        f"evidence: the probe tripped on a generation pathology ({found['pathology']}, {words.finding}). "
        f"{found['pathological']} of {found['observations']} generations it observed "
        f"{words.ended.format(caps=caps)} (finish reasons: {reasons})"
        + (f"; what to change: {words.advice}" if words.advice else "")
        + (f", {when} s after the first request" if when is not None else "")
        + f". {after}"
        + (f" {context[0].upper()}{context[1:]}." if context else "")
    )


def table(verdicts: list[Verdict]) -> str:
    """The verdicts as one table per run, each headed by its results file and run.

    The columns are task, metric, score, status, cap rate and cause. Then come each verdict's
    reason, and the evidence of a run the probe cut short.
    """
    out: list[str] = []
    for source, rows in _by_run(verdicts):
        out.append(safe(_origin(source)) + ":")
        cells = [_HEADINGS, *(tuple(safe(c) for c in _cells(v)) for v in rows)]
        widths = [max(len(row[i]) for row in cells) for i in range(len(_HEADINGS))]
        out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
        out += [safe(f"  {v.task if v.task is not None else '-'}: {v.status.value} ({v.reason})") for v in rows]
        found = next((v.pathology for v in rows if v.pathology), None)
        if found:
            out.append(safe(pathology_text(found)))
        out.append("")
    return "\n".join(out).rstrip()


def markdown(verdicts: list[Verdict]) -> str:
    """The verdicts as GitHub-flavoured Markdown: a heading with the worst status, one table
    (task, metric, score, status, cap rate, cause, run) and, for each run the probe cut
    short, its evidence. Meant to be appended to ``$GITHUB_STEP_SUMMARY``."""
    lines = [f"### eval-probe read: {Status.worst(v.status for v in verdicts).value}", ""]
    headings = (*_HEADINGS, "results")
    lines.append(_md_row(headings))
    lines.append("|" + "|".join(" --- " for _ in headings) + "|")
    lines += [_md_row((*_cells(v), _origin(v.source))) for v in verdicts]
    lines.append("")
    lines += [f"- **{_md(v.task if v.task is not None else '-')}**: {_md(v.status.value)}: {_md(v.reason)}"
              for v in verdicts]  # fmt: skip
    for source, rows in _by_run(verdicts):
        found = next((v.pathology for v in rows if v.pathology), None)
        if found:
            lines += ["", f"**Evidence** ({_md(_origin(source))}): {_md(pathology_text(found))}"]
    return "\n".join(lines) + "\n"


def _cells(v: Verdict) -> tuple[str, ...]:
    score = "none" if v.score is None else f"{v.score:.4g}"
    rate = "n/a" if v.cap_rate is None else f"{v.cap_rate:.1%}"
    return (v.task if v.task is not None else "-", v.metric or "-", score, v.status.value, rate, v.cause or "-")


def _by_run(verdicts: list[Verdict]) -> list[tuple[Source, list[Verdict]]]:
    # One pass: rows keep their order within a run, runs the order they first appear in.
    runs: dict[Source, list[Verdict]] = {}
    for verdict in verdicts:
        runs.setdefault(verdict.source, []).append(verdict)
    return list(runs.items())


def _origin(source: Source) -> str:
    parts: list[str] = [str(source.results_file) if source.results_file else "no results file"]
    details = [
        f"run {source.run_id}" if source.run_id else "",
        f"started {_iso(source.started_at)}" if source.started_at is not None else "",
        f"concurrency {source.concurrency}" if source.concurrency is not None else "",
        f"trip record {source.trip_record}" if source.trip_record else "",
    ]
    shown = ", ".join(d for d in details if d)
    return parts[0] + (f" ({shown})" if shown else "")


def _iso(when: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when)) if 0 <= when < 253402300800 else repr(when)


# Markdown's syntax characters are escaped with a backslash (CommonMark honours it for any
# ASCII punctuation), and '<', '>', '&' become entities, so a cell shows its text, never markup.
_MD_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+\-!|~])")
_ENTITIES: dict[str, str] = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def _md(value: object) -> str:
    escaped = _MD_SPECIAL.sub(r"\\\1", safe(value))
    return "".join(_ENTITIES.get(c, c) for c in escaped)


def _md_row(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(_md(c) for c in cells) + " |"
