"""What ``eval-probe run`` says when its command has ended.

:func:`summarise` computes a :class:`Summary` once from the command's own records; its
:meth:`~Summary.line` words it once. A summary speaks only for the command's own evaluations,
known by their run identities (the probe's report, and the trips noted before their records were
written), and only for what the probe watched. Any other trip record is another run's.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.reader.documents import Unreadable
from probe.reader.evidence import cap_rate, counts_flagged_endings, run_evidence
from probe.reader.model import SidecarState
from probe.reader.sidecar import Sidecar, read_sidecar, read_trip_records
from probe.runtime.core.contract import ENV_SWITCH, EVIDENCE_KEY, SIDECAR_NAME, cause_words
from probe.runtime.core.evidence import is_pathological
from probe.runtime.core.sidecar import is_count
from probe.runtime.scope.log import one_line
from probe.runtime.scope.report import read_notes, read_report

# What to read when the directory is not known.
_ITS_DIRECTORY = "its results directory"


@dataclass(frozen=True)
class Summary:
    """The summary of one command.

    First comes what is known (``headline``). Then, in every case, the same sentences follow. They
    name another run's record in the directory, the signal that ended the command, the processes
    still running, and what to read next.
    """

    headline: str
    reads: tuple[str, ...] = ()
    signal: int | None = None
    other: str | None = None  # another run's trip record in the results directory
    still_running: int = 0

    def line(self) -> str:
        sentences = [f"summary: {self.headline}"]
        if self.other:
            sentences.append(f"The sidecar {self.other} is another run's, not this one's")
        if self.signal is not None:
            sentences.append(f"Then the command was ended by signal {self.signal} ({signal_name(self.signal)})")
        if self.still_running:
            sentences[-1] += f"; still running then: {self.still_running} process(es) it started (listed above)"
        if self.reads:
            sentences.append("Next: " + "; ".join(f"eval-probe read {where}" for where in self.reads))
        return one_line(". ".join(sentences))


def summary(result_dir: Path, report: Path, **context: Any) -> str:
    """The summary line of a command whose results directory is ``result_dir`` and whose probe
    reported to ``report``; ``context`` as :func:`summarise` takes it. See docs/cli.md."""
    return summarise(result_dir, report, **context).line()


@dataclass(frozen=True)
class _Command:
    """What the command's own evaluations left.

    It holds the evaluations in its report and in reports of nested ``eval-probe run`` commands. It
    holds their run identities, including those of trips noted before their records were written. It
    holds where lm-eval saved their results and where each trip was to write its record. It holds
    those records, wherever they lie.
    """

    evaluations: list[dict[str, Any]]
    ours: set[str]
    unreported: list[str]
    saved: list[str]
    noted_places: list[str]
    records: list[Sidecar]
    active: bool  # the probe was active (installed on lm-eval or vLLM) in a process of the command
    silent: int  # nested runs where the probe was active, that reported no evaluation and noted no trip


# How many nested eval-probe run reports are read, at most (any process of the command may note one).
_NESTED = 64


def _command(result_dir: Path, report: Path, started: float | None = None) -> _Command:
    reports, evaluations, seen = [str(report)], [], set()
    tripping: dict[str, str | None] = {}
    saved: dict[str, list[str]] = {}
    silent = 0
    for path in reports:
        own = read_report(path)
        notes = read_notes(path)
        silent += path != str(report) and not own and not notes.tripping and os.path.lexists(f"{path}.active")
        for evaluation in own:
            run = evaluation.get("run_id")
            if isinstance(run, str) and run in seen:  # a nested report is also forwarded once it ends
                continue
            seen.add(run if isinstance(run, str) else "")
            evaluations.append(evaluation)
        tripping.update(notes.tripping)
        for run, paths in notes.saved.items():
            saved.setdefault(run, []).extend(paths)
        for nested in notes.nested:  # each file once, however it is spelt
            if len(reports) < _NESTED and _fresh(nested, started) and len(_once([*reports, nested])) > len(reports):
                reports.append(nested)
    reported = {run for e in evaluations if isinstance(run := e.get("run_id"), str)}
    ours = reported | set(tripping)
    places = [where for run, where in tripping.items() if where]
    # Trip records are looked for in the results directory, and where the notes and reports say each went.
    found_in = [result_dir, *(Path(p).parent for p in [*places, *_named_records(evaluations)])]
    found = [r for place in _once(found_in) for r in read_trip_records(place) if r.state is SidecarState.VALID]
    return _Command(
        evaluations, ours, sorted(set(tripping) - reported),
        _once([path for run, paths in saved.items() if run in ours for path in paths]), places,
        _once_by_path([r for r in found if r.trip.get("run_id") in ours and _after(r, started)]),
        any(os.path.lexists(f"{path}.active") for path in reports), silent,
    )  # fmt: skip


def _fresh(path: str, started: float | None) -> bool:
    """Whether a nested report is there, and was written since the command started (a leftover
    of an earlier command is no part of it). A run killed mid-evaluation may have left only the
    notes beside its report."""
    for beside in ("", ".active", ".nested"):
        try:
            if started is None or os.stat(f"{path}{beside}").st_mtime >= started - 1:
                return os.path.lexists(f"{path}{beside}")
        except (OSError, ValueError):
            continue
    return False


def _after(record: Sidecar, started: float | None) -> bool:
    """Whether ``record`` was written since the command started (an earlier run's is not its)."""
    when = record.trip.get("tripped_at")
    return started is None or (isinstance(when, int | float) and when >= started - 1)


def summarise(
    result_dir: Path,
    report: Path,
    ended_by: int | None = None,
    still_running: int = 0,
    switched_off: str = "",
    started: float | None = None,
) -> Summary:
    """What is known of the command. ``ended_by`` is the signal that ended it, if one did. With
    ``still_running`` processes, no trip yet is no verdict. ``switched_off`` is the probe's switch
    when the command started switched off. No trip record or nested report from before
    ``started`` (when the command started) is its own."""
    common = {"signal": ended_by, "still_running": still_running}
    sidecar = read_sidecar(result_dir)
    if sidecar.state is SidecarState.UNREADABLE:
        return Summary(f"the sidecar is unreadable ({sidecar.error})", **common)
    command = _command(result_dir, report, started)
    if sidecar.state is SidecarState.VALID and sidecar.trip.get("run_id") not in command.ours:
        common["other"] = str(sidecar.path)
    here = [r for r in command.records if _inside(r.path, result_dir)]
    if command.records:
        return _tripped(result_dir, command, here, common)
    tripped = [e for e in command.evaluations if e.get("tripped") is True]
    if tripped:  # the report says so, but no record of its run identity is found now
        named = _named_records(tripped)
        return Summary(
            f"TRIPPED in {len(tripped)} of {len(command.evaluations)} evaluation(s), the probe's report says, but "
            f"no trip record of theirs is found now ("
            + (f"it was written to {'; '.join(named)}, and has been moved or removed" if named
               else "written by another process of the run") + ")",
            _once([str(Path(path).parent) for path in named] + command.saved) or (_ITS_DIRECTORY,), **common,
        )  # fmt: skip
    if command.unreported:  # a trip was noted, then its process ended before it reported, and no record is found
        return Summary(
            f"not known: a trip of run {', '.join(command.unreported)} was noted, but its process ended before "
            "it reported, and no trip record of it written by this command is found"
            + (f" where it was to be written ({'; '.join(command.noted_places)})" if command.noted_places else "")
            + ": it was removed, or never written (then nothing was answered blank)",
            tuple(command.saved), **common,
        )  # fmt: skip
    if still_running:
        return Summary("not known yet (no trip record of this run so far): read it once they finish",
                       (str(result_dir),), **common)  # fmt: skip
    if not command.evaluations:
        return _nothing_reported(result_dir, report, command.active, switched_off, common)
    if not _as_written(command.evaluations):
        return Summary(f"not known: no evaluation in the probe's report {report} says it tripped, but its figures "
                       "are not as the probe writes them", (str(result_dir),), **common)  # fmt: skip
    silent = (f"; {command.silent} nested eval-probe run(s) loaded the probe but reported no evaluation (killed "
              "before its end, or it evaluated nothing): not watched to its end") if command.silent else ""  # fmt: skip
    return Summary(_healthy(command.evaluations) + silent, tuple(command.saved), **common)


def _tripped(result_dir: Path, command: _Command, here: list[Sidecar], common: dict[str, Any]) -> Summary:
    """The summary when the command's evaluations tripped and their records were found.

    Each is named, with its cause and what to change. The directory's own sidecar comes first, if it
    is one of them.
    """
    elsewhere = [r for r in command.records if r not in here]
    # The evaluations that ended before they reported count too: each noted its trip.
    tripped = sum(e.get("tripped") is True for e in command.evaluations) + len(command.unreported)
    total = len(command.evaluations) + len(command.unreported)
    reads = _once([str(result_dir)] * bool(here) + [str(Path(r.path).parent) for r in elsewhere] + command.saved)
    if not here:
        return Summary(
            f"TRIPPED in {max(tripped, len(elsewhere))} of {max(total, len(elsewhere))} "
            f"evaluation(s), whose trip record is not in {result_dir}: " + "; ".join(str(r.path) for r in elsewhere),
            reads, **common,
        )  # fmt: skip
    sidecar = os.path.realpath(result_dir / SIDECAR_NAME)
    first, *others = sorted(here, key=lambda r: (os.path.realpath(r.path) != sidecar, str(r.trip.get("tripped_at"))))
    return Summary(
        f"TRIPPED {_trip_words(first, _short_circuited(command, first))}. Sidecar: {first.path}"
        + "".join(f". Tripped too, its trip record elsewhere: {r.path} {_trip_words(r)}" for r in others + elsewhere),
        reads, **common,
    )  # fmt: skip


def _trip_words(record: Sidecar, cut: str | None = None) -> str:
    """A trip record in words: its pathology, what happened, how many requests were answered
    blank (``cut``, when known), what to change."""
    trip = record.trip
    what, advice = cause_words(trip.get("cause"))
    return (
        f"({trip['pathology']}): {trip['pathological']}/{trip['observations']} generations {what} "
        f"(max_tokens {trip['max_tokens'] or 'not recorded'}); "
        + (f"{cut} requests short-circuited; " if cut is not None else "")
        + f"what to change: {advice}"
    )


def _short_circuited(command: _Command, first: Sidecar) -> str:
    """How many requests the command's tripped evaluations answered blank.

    This comes from the report when it holds several that tripped, else from the record's final
    counters.
    """
    tripped = [e for e in command.evaluations if e.get("tripped") is True]
    if len(tripped) > 1 and _as_written(tripped):
        total = sum(_blank_answered(e) for e in tripped)
        return f"{total} (in {len(tripped)} of {len(command.evaluations)} evaluations)"
    count = first.final.get("short_circuited_requests") if first.final else None
    return str(count) if is_count(count) else "?"


def _nothing_reported(
    result_dir: Path, report: Path, active: bool, switched_off: str, common: dict[str, Any]
) -> Summary:
    """No evaluation of the command reported, and none tripped: why, as far as it is known."""
    if os.path.lexists(report):  # the probe writes one only with evaluations in it
        return Summary(f"not known: the probe's report {report} cannot be read as one it writes",
                       (str(result_dir),), **common)  # fmt: skip
    if switched_off:
        return Summary(f"NOT WATCHED: the probe was switched off ({ENV_SWITCH}={switched_off}), so it observed "
                       "nothing", **common)  # fmt: skip
    if not active:
        return Summary(
            "NOT WATCHED: the probe was active in no process of the command (no lm-eval ran, or it ran where "
            "PYTHONPATH does not reach: python -I, -E or -S, sudo, env -i, a container, a remote shell), so it "
            "observed nothing", **common,
        )  # fmt: skip
    if common["signal"] is not None:  # the probe reports as each evaluation ends: a signal stops that
        return Summary(f"no trip record of this run in {result_dir}: the probe had not tripped when the signal "
                       "came", **common)  # fmt: skip
    # lm-eval loaded the probe somewhere (a helper that imported it, say), but no evaluation ended
    # under it, and none tripped: never "did not trip", which a user reads as healthy.
    return Summary(
        "NOT WATCHED to its end: lm-eval loaded the probe, but no evaluation under it ended, and none tripped (an "
        "lm-eval run where PYTHONPATH does not reach is not watched: python -I, -E or -S, sudo, env -i, a "
        "container, a remote shell; one killed before its end reports nothing)", **common,
    )  # fmt: skip


def _flagged_cut(figures: dict[str, Any]) -> int:
    """How many of a task's flagged generations then ended cut off, as the evidence counts them
    (``flagged_cut_off``); older evidence: those that ended with a pathological label."""
    endings = figures.get("flagged_endings")
    if not isinstance(endings, dict):
        return 0
    if counts_flagged_endings(figures):  # checked against the endings where the report was read
        return figures["flagged_cut_off"]
    return sum(n for label, n in endings.items() if is_pathological(label) and is_count(n))


def _healthy(evaluations: list[dict[str, Any]]) -> str:
    """What the probe observed in evaluations that did not trip. A flagged generation that then
    ran to its cap is cut off; one that stopped is only flagged."""
    groups = [g for e in evaluations for g in e["groups"]]
    tasks = [(name, figures) for e in evaluations for name, figures in e["tasks"].items()]
    counted = [f for _, f in tasks] + [e["unattributed"] for e in evaluations if e.get("unattributed")]
    seen = sum(g["observations"] for g in groups)
    # A group's pathological count holds its loop flags too, each once, whatever its ending.
    flagged = sum(min(g.get("flagged", 0), g["pathological"]) for g in groups if is_count(g.get("flagged", 0)))
    flagged_cut = min(flagged, sum(_flagged_cut(f) for f in counted))
    cut = sum(g["pathological"] for g in groups) - flagged + flagged_cut
    rates = [(name, cap_rate(figures)) for name, figures in tasks]
    worst = max(((name, rate) for name, rate in rates if rate), key=lambda found: found[1], default=None)
    unjudged = sum(f.get("below_min_max_tokens", 0) + f.get("unknown_budget", 0) for f in counted)
    highest = f"; most cut off: {worst[0]}, {worst[1]:.1%} of its generations" if worst else ""
    if unjudged:  # counted in the evidence, not by the rule: a budget below MIN_MAX_TOKENS, or unknown
        highest = f"; {unjudged} more observed under a budget the rule does not judge{highest}"
    if not seen:  # lm-eval ended (or failed) before any generation that counts for the rule
        return f"the probe did not trip: it observed no generation the rule judges{highest.replace(' more', '', 1)}"
    return (
        f"the probe did not trip: {cut} of {seen} generations observed were cut off"
        + (f" ({flagged_cut} of them flagged as looping first)" if flagged_cut else "")
        + (f", {flagged - flagged_cut} more flagged as looping while they ran" if flagged > flagged_cut else "")
        + f", in {len(groups)} group(s) of generation settings of {len(evaluations)} evaluation(s){highest}"
    )


def _blank_answered(evaluation: dict[str, Any]) -> int:
    """How many requests the probe answered blank in one evaluation of the report."""
    counted = [*evaluation["tasks"].values(), *([evaluation["unattributed"]] if evaluation.get("unattributed") else [])]
    return sum(f.get("short_circuited", 0) for f in counted if is_count(f.get("short_circuited", 0)))


def _as_written(evaluations: list[dict[str, Any]]) -> bool:
    """Whether the report's evaluations are evidence documents as the probe writes them.

    Any process of the command may write the report, so each is checked as the reader checks a
    results file (``run_evidence``). Group counts must hold and agree with the trip flag. A trip
    record is named only where it tripped. Task names must print as one line. Each recorded cut-off
    rate must be a fraction. See docs/cli.md.
    """
    for evaluation in evaluations:
        try:
            run_evidence({EVIDENCE_KEY: evaluation})
        except Unreadable:
            return False
        groups = evaluation.get("groups")
        if not isinstance(groups, list) or not all(
            isinstance(g, dict) and type(g.get("tripped")) is bool and is_count(g.get("observations"))
            and is_count(g.get("pathological")) and g["pathological"] <= g["observations"] for g in groups
        ):  # fmt: skip
            return False
        if evaluation["tripped"] != any(g["tripped"] for g in groups) or (
            evaluation.get("sidecar") is not None and not evaluation["tripped"]
        ):
            return False
        tasks = evaluation["tasks"].items()
        if not all(name.isprintable() and _a_fraction(figures.get("cut_off_rate")) for name, figures in tasks):
            return False
    return True


def _a_fraction(rate: Any) -> bool:
    """Whether a task's cut-off rate is as the probe writes it: None (nothing observed) or a fraction."""
    return rate is None or (type(rate) in (int, float) and 0 <= rate <= 1)


def _named_records(evaluations: list[dict[str, Any]]) -> list[str]:
    """The trip records the report names for its evaluations that tripped, each file once.

    A record that names no path, or one that would not print as one line, is left out. Any process
    may write the report.
    """
    paths = [e.get("sidecar") for e in evaluations if e.get("tripped") is True]
    return _once([p for p in paths if isinstance(p, str) and p.strip() and p.isprintable()])


def _once(paths: list[Any]) -> list[str]:
    """``paths`` in order, each file once however it is spelt."""
    seen: set[str] = set()
    kept = []
    for path in map(str, paths):
        real = path
        with contextlib.suppress(ValueError, OSError):  # a NUL, a lone surrogate
            real = os.path.realpath(path)
        if real not in seen:
            seen.add(real)
            kept.append(path)
    return kept


def _once_by_path(records: list[Sidecar]) -> list[Sidecar]:
    kept = {str(r.path): r for r in records}
    return [kept[path] for path in _once(list(kept))]


def _inside(path: Path, directory: Path) -> bool:
    """Whether ``path`` lies in ``directory`` or a subdirectory of it, however either is spelt."""
    with contextlib.suppress(ValueError, OSError):
        return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(directory))
    return False


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
