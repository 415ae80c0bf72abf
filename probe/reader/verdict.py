"""Turning a result directory into verdicts, one per task: ok, below_floor or unavailable.

A measured 0.0 is a measurement (below the floor); an error is not (unavailable); a task
the probe cut short is never ok, and carries the probe's evidence; a score made of cut-off
answers carries a caveat with its bound.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from probe.reader import evidence as ev
from probe.reader.candidates import Candidate, list_candidates, newest
from probe.reader.documents import Unreadable
from probe.reader.inferencex import Concurrencies, read_meta_env
from probe.reader.results import pick_metric
from probe.reader.scores import accuracy_meets_floor, finite_score
from probe.reader.sidecar import Sidecar, read_sidecar
from probe.runtime.contract import PATHOLOGY, cause_words, main_cause

# A sidecar whose trip predates the start of the run in the results file by more than
# this is from an earlier run in the same directory (used when the results carry no run id).
_STALE_SLACK_S = 5.0
# Worst first: the exit code of several verdicts is the worst one's.
SEVERITY = ("unavailable", "below_floor", "ok")


def classify_all(
    result_dir: Path | str,
    floor: float,
    metric: str | None = None,
    higher_is_better: bool = True,
    max_cap_rate: float = ev.DEFAULT_MAX_CAP_RATE,
    cap_rate_fails: bool = False,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """A verdict for every task of the newest results, one set per InferenceX concurrency.

    Never empty: a directory with nothing to judge gives one unavailable verdict that says why.
    ``floor`` must be finite (ValueError otherwise: against NaN every score is below it).
    """
    if finite_score(floor) is None:
        raise ValueError(f"the floor must be a finite number, not {floor!r}")
    root = Path(result_dir)
    now = time.time() if now is None else now
    judge = _Judge(floor, metric, higher_is_better, max_cap_rate, cap_rate_fails, read_sidecar(root, now))
    try:
        concurrencies = read_meta_env(root)
    except Unreadable as error:
        return [judge.unavailable(None, None, f"InferenceX's meta_env.json cannot be read: {error}")]
    by_concurrency: dict[int | None, list[Candidate]] = {}
    for candidate in list_candidates(root, now):
        by_concurrency.setdefault(candidate.concurrency, []).append(candidate)
    verdicts: list[dict[str, Any]] = []
    for concurrency in sorted(set(by_concurrency) | set(concurrencies.asked), key=lambda c: (c is not None, c)):
        verdicts += judge.concurrency(concurrency, by_concurrency.get(concurrency, []), concurrencies)
    return verdicts or [judge.no_results(root)]


def classify(
    result_dir: Path | str,
    floor: float,
    task: str | None = None,
    metric: str | None = None,
    higher_is_better: bool = True,
    max_cap_rate: float = ev.DEFAULT_MAX_CAP_RATE,
    cap_rate_fails: bool = False,
    now: float | None = None,
) -> dict[str, Any]:
    """The verdict on one task (default: the first task of the newest results)."""
    verdicts = classify_all(result_dir, floor, metric, higher_is_better, max_cap_rate, cap_rate_fails, now)
    if task is None:
        return verdicts[0]
    found = [v for v in verdicts if v["task"] == task]
    if found:
        return found[0]
    first = verdicts[0]
    where = first["results_file"] or str(result_dir)
    return {**first, **_blank(task, None), "status": "unavailable", "reason": f"task {task!r} is not in {where}"}


def worst(verdicts: Iterable[dict[str, Any]]) -> str:
    """The worst status among ``verdicts`` (see SEVERITY)."""
    return min((v["status"] for v in verdicts), key=SEVERITY.index)


def _blank(task: str | None, metric: str | None) -> dict[str, Any]:
    return {"task": task, "metric": metric, "score": None, "cap_rate": None, "cause": None, "caveat": None,
            "evidence": None, "pathology": None}  # fmt: skip


class _Judge:
    """The rules, applied to one task at a time with the options of one `read`."""

    def __init__(
        self, floor: float, metric: str | None, higher: bool, max_cap_rate: float, fails: bool, sidecar: Sidecar
    ) -> None:
        self.floor, self.metric, self.higher = floor, metric, higher
        self.max_cap_rate, self.fails, self.sidecar = max_cap_rate, fails, sidecar

    def base(self, concurrency: int | None, candidate: Candidate | None) -> dict[str, Any]:
        return {
            "status": None, "reason": None, **_blank(None, None), "floor": self.floor,
            "higher_is_better": self.higher, "concurrency": concurrency,
            "results_file": str(candidate.path) if candidate else None,
            "sidecar": {"state": self.sidecar.state, "path": str(self.sidecar.path), "error": self.sidecar.error},
        }  # fmt: skip

    def unavailable(self, concurrency: int | None, candidate: Candidate | None, reason: str) -> dict[str, Any]:
        return {**self.base(concurrency, candidate), "status": "unavailable", "reason": reason}

    def no_results(self, root: Path) -> dict[str, Any]:
        """Nothing to judge: unavailable, unless a trip record explains why (the run was cut
        short and then ended before lm-eval wrote its results)."""
        missing = (f"no results file under {root} (lm-eval's results_<time>.json, or InferenceX's "
                   "results_<time>_conc<N>.json)")  # fmt: skip
        sidecar = self.sidecar
        if sidecar.state == "unreadable":
            missing += f"; and the probe's sidecar is unreadable ({sidecar.error})"
        verdict = self.unavailable(None, None, missing)
        if sidecar.state == "valid" and sidecar.trip.get("tripped") is True:
            verdict.update(status="below_floor", pathology=_pathology(sidecar.trip, sidecar.final, None),
                           reason=f"generation pathology: {PATHOLOGY} (the probe tripped); and {missing}",
                           cause="non-termination: cut short")  # fmt: skip
        return verdict

    def concurrency(self, concurrency: int | None, candidates: list[Candidate], asked: Concurrencies) -> list[dict]:
        if concurrency in asked.failed:
            return [self.unavailable(concurrency, None, f"InferenceX records concurrency {concurrency} as failed")]
        chosen = newest(candidates)
        if chosen is None:
            return [self.unavailable(concurrency, None, f"no results file for concurrency {concurrency}")]
        if chosen.reason is not None or chosen.results is None:
            return [self.unavailable(concurrency, chosen, chosen.reason or "no results")]
        trip, final, state = self._trip_of(chosen)
        tasks = [t for t in chosen.results if isinstance(chosen.results[t], dict)]
        if not tasks:
            return [self.unavailable(concurrency, chosen, f"no task in {chosen.path.name}")]
        verdicts = {name: self.task(concurrency, chosen, name, trip, final, state, len(tasks)) for name in tasks}
        _groups_follow_their_tasks(verdicts, chosen.subtasks or {})
        return list(verdicts.values())

    def _trip_of(self, chosen: Candidate) -> tuple[dict | None, dict | None, str]:
        """This run's trip record from the sidecar, if the sidecar is this run's."""
        sidecar = self.sidecar
        if sidecar.state != "valid" or sidecar.trip.get("tripped") is not True:
            return None, None, sidecar.state
        run = (chosen.evidence or {}).get("run_id")
        if run is not None:
            if sidecar.trip.get("run_id") != run:
                return None, None, "another run's"
        elif chosen.started_at is not None and sidecar.trip["tripped_at"] < chosen.started_at - _STALE_SLACK_S:
            return None, None, "stale"
        return sidecar.trip, sidecar.final, "valid"

    def task(
        self, concurrency: int | None, chosen: Candidate, task: str, trip: dict | None, final: dict | None,
        state: str, n_tasks: int,
    ) -> dict[str, Any]:  # fmt: skip
        verdict = self.base(concurrency, chosen)
        verdict["sidecar"]["state"] = state
        metrics = chosen.results[task]
        metric = self.metric or pick_metric(metrics)
        value = finite_score(metrics.get(metric)) if metric in metrics else None
        figures = (chosen.evidence or {}).get("tasks", {}).get(task)
        verdict.update(task=task, metric=metric, score=value, evidence=figures, cap_rate=ev.cap_rate(figures))

        def decide(status: str, reason: str, cause: str | None = None) -> dict[str, Any]:
            return {**verdict, "status": status, "reason": reason, "cause": cause}

        if self.sidecar.state == "unreadable":
            return decide("unavailable", f"the probe's sidecar is unreadable ({self.sidecar.error}): whether the "
                          "run was cut short cannot be told")  # fmt: skip
        short = ev.cut_short(chosen.evidence, trip, final)
        unknown = (trip is not None or bool(chosen.evidence and chosen.evidence["tripped"])) and ev.mapping_unknown(
            chosen.evidence, trip
        )
        if task in short or (unknown and n_tasks == 1):
            verdict["pathology"] = _pathology(trip, final, figures)
            missing = "" if value is not None else f"; and no finite score for {metric!r}"
            return decide("below_floor", f"generation pathology: {PATHOLOGY} (the probe cut this task short){missing}",
                          "non-termination: cut short")  # fmt: skip
        if unknown and not (figures and not figures["short_circuited"]):
            return decide("unavailable", "the probe cut part of this run short, and whether this task was among "
                          "what it cut is not recorded")  # fmt: skip
        if metric is None or metric not in metrics:
            return decide("unavailable", f"metric {metric!r} is not in task {task!r}")
        if value is None:
            return decide("unavailable", f"the score {metrics.get(metric)!r} is not a finite number")
        return self._score(verdict, figures, value, decide)

    def _score(self, verdict: dict[str, Any], figures: dict | None, value: float, decide: Any) -> dict[str, Any]:
        caveat = ev.caveat(figures, value, self.higher, self.max_cap_rate) if figures else None
        quiet = ev.silence(figures) if figures else None
        cause = quiet and "did not answer"
        if caveat:
            verdict["caveat"] = caveat
            cause = cause or f"cut off: {ev.cause_text(figures)}"  # type: ignore[arg-type]
        notes = "".join(f"; {note}" for note in (quiet, caveat and caveat["text"]) if note)
        if caveat and self.fails:
            return decide("below_floor", f"{caveat['cut_off']} of {caveat['observations']} generations were cut off, "
                          f"more than --max-cap-rate {self.max_cap_rate:g}{notes}", cause)  # fmt: skip
        if accuracy_meets_floor(value, self.floor, self.higher):
            return decide("ok", f"the score meets the floor{notes}", cause)
        return decide("below_floor", f"the score is below the floor{notes}", cause)


def _groups_follow_their_tasks(verdicts: dict[str, dict[str, Any]], subtasks: dict[str, list[str]]) -> None:
    """A group's row aggregates its tasks' answers: it is never better than its worst task.

    A group with a task the probe cut short is below_floor with that task's evidence; one
    with an unavailable task is unavailable. (A task merely under the floor says nothing of
    the group's own score.) Nested groups follow their subgroups.
    """
    for _ in range(len(subtasks)):  # enough rounds for any nesting
        for group, members in subtasks.items():
            verdict = verdicts.get(group)
            judged = [v for m in members if (v := verdicts.get(m)) and (v["pathology"] or v["status"] == "unavailable")]
            if verdict is None or not judged:
                continue
            bad = min(judged, key=lambda v: SEVERITY.index(v["status"]))
            if SEVERITY.index(bad["status"]) >= SEVERITY.index(verdict["status"]):
                continue
            verdict.update(status=bad["status"], cause=bad["cause"], pathology=bad["pathology"],
                           reason=f"its task {bad['task']!r} is {bad['status']} ({bad['reason']})")  # fmt: skip


def _pathology(trip: dict | None, final: dict | None, figures: dict | None) -> dict[str, Any]:
    keys = (
        "pathology", "observations", "pathological", "ratio", "finish_reasons", "repetition", "max_tokens",
        "group", "tasks", "settings", "settings_fingerprint", "tripped_at_iso", "seconds_since_first_request", "pid",
        "lm_eval_version", "model", "base_url", "run_id", "backend", "cause",
    )  # fmt: skip
    found = {k: (trip or {}).get(k) for k in keys}
    if trip is None and figures is not None:  # only the results file's evidence is at hand
        found.update(pathology=PATHOLOGY, observations=figures["observations"], pathological=figures["cut_off"],
                     finish_reasons=figures.get("finish_reasons"), max_tokens=figures.get("max_tokens"),
                     cause=main_cause(figures.get("causes") or {}))  # fmt: skip
    found["short_circuited_requests"] = final.get("short_circuited_requests") if final else None
    found["cancelled_in_flight"] = final.get("cancelled_in_flight") if final else None
    if found["short_circuited_requests"] is None and figures is not None:
        found["short_circuited_requests"] = figures["short_circuited"]
        found["cancelled_in_flight"] = figures["cancelled_in_flight"]
    return found


def _safe(value: object) -> str:
    """``value`` as text a terminal shows as it is: control characters (a newline that would
    forge a table row, an escape sequence) are written as escapes."""
    text = str(value)
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def describe(verdict: dict[str, Any]) -> str:
    """A human summary of one verdict: status, score, floor, file, caveat and evidence."""
    what = f"{_safe(verdict['metric'])} of {_safe(verdict['task'])}" if verdict["task"] else "no task"
    score = "none" if verdict["score"] is None else f"{verdict['score']:g}"
    side = "higher" if verdict["higher_is_better"] else "lower"
    lines = [
        f"status:  {verdict['status']} ({_safe(verdict['reason'])})",
        f"score:   {score} ({what}); floor {verdict['floor']:g}, {side} is better",
        f"results: {verdict['results_file'] or 'none found'}"
        + (f" (concurrency {verdict['concurrency']})" if verdict.get("concurrency") is not None else ""),
        f"sidecar: {verdict['sidecar']['state']}"
        + (f" ({verdict['sidecar']['error']})" if verdict["sidecar"]["error"] else ""),
    ]
    figures = verdict.get("evidence")
    if figures:
        lines.append(
            f"generations: {figures['observations']} observed of {figures['generate_requests']} asked; "
            f"{figures['cut_off']} cut off ({ev.cause_text(figures)}); {figures['empty_answers']} empty answers"
        )
    found = verdict["pathology"]
    if found:
        lines.append(_pathology_text(found))
    return "\n".join(_safe(line) for line in lines)


def _pathology_text(found: dict[str, Any]) -> str:
    reasons = ", ".join(f"{k}={v}" for k, v in (found["finish_reasons"] or {}).items())
    caps = ", ".join(str(m) for m in found["max_tokens"] or [])
    if found["short_circuited_requests"] is None:
        after = "The final counters were not written (the process ended before its exit handlers ran)."
    else:
        after = (
            f"{found['short_circuited_requests']} requests were then answered with empty strings without "
            f"contacting the server, and {found['cancelled_in_flight']} in-flight requests were cancelled."
        )
    when = found["seconds_since_first_request"]
    where = [
        f"model {found['model']} at {found['base_url']}" if found["model"] else "",
        f"lm-eval {found['lm_eval_version']}" if found["lm_eval_version"] else "",
        f"probe settings {found['settings_fingerprint']}" if found["settings_fingerprint"] else "",
    ]
    context = ", ".join(w for w in where if w)
    what, advice = cause_words(found.get("cause"))
    return (
        f"evidence: the probe tripped on a generation pathology ({found['pathology']}). "
        f"{found['pathological']} of {found['observations']} generations it observed {what} "
        f"(max_tokens {caps}; finish reasons: {reasons}); what to change: {advice}"
        + (f", {when} s after the first request" if when is not None else "")
        + f". {after}"
        + (f" {context[0].upper()}{context[1:]}." if context else "")
    )


def table(verdicts: list[dict[str, Any]]) -> str:
    """The verdicts as a table: task, metric, score, status, cap rate, cause; then each
    verdict's reason, and one block per InferenceX concurrency."""
    out: list[str] = []
    for concurrency in dict.fromkeys(v.get("concurrency") for v in verdicts):
        rows = [v for v in verdicts if v.get("concurrency") == concurrency]
        if concurrency is not None:
            out.append(f"concurrency {concurrency}:")
        cells = [("task", "metric", "score", "status", "cap rate", "cause")]
        for v in rows:
            score = "none" if v["score"] is None else f"{v['score']:.4g}"
            rate = "n/a" if v["cap_rate"] is None else f"{v['cap_rate']:.1%}"
            cells.append(tuple(_safe(c) for c in (v["task"] or "-", v["metric"] or "-", score, v["status"], rate,
                                                  v["cause"] or "-")))  # fmt: skip
        widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
        out += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
        out += [_safe(f"  {v['task'] or '-'}: {v['status']} ({v['reason']})") for v in rows]
        found = next((v["pathology"] for v in rows if v["pathology"]), None)
        if found:
            out.append(_safe(_pathology_text(found)))
        out.append("")
    return "\n".join(out).rstrip()
