"""Turning a result directory into verdicts: ok, below_floor or unavailable, per task of every run.

A measured 0.0 is below the floor; an error is unavailable. A task the probe cut short is never ok.
A score made of cut-off answers carries a caveat. A group is never better than its worst task.
Evidence that contradicts itself is unavailable. Reading costs time linear in what is read. See
docs/reading.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.reader import evidence as ev
from probe.reader.candidates import Candidate, list_candidates
from probe.reader.documents import Unreadable
from probe.reader.evaluations import Evaluation, Holdings, holdings
from probe.reader.inferencex import Concurrencies, read_meta_env
from probe.reader.model import SidecarState, SidecarView, Source, Status, TripContext, Verdict
from probe.reader.results import measured, pick_metric
from probe.reader.scores import accuracy_meets_floor, finite_score
from probe.reader.sidecar import Sidecar, read_trip_records
from probe.reader.words import trip_words
from probe.runtime.core.contract import PATHOLOGY, SIDECAR_NAME, main_cause
from probe.runtime.core.evidence import is_pathological

_NO_RESULTS = "(lm-eval's results_<time>.json, or InferenceX's results_<time>_conc<N>.json)"


@dataclass(frozen=True)
class Options:
    """The options of one ``read``.

    They hold the floor and which side of it is better, and the cap-rate rules. ``metric`` None
    means each task's first accuracy-like one.
    """

    floor: float
    metric: str | None = None
    higher_is_better: bool = True
    max_cap_rate: float = ev.DEFAULT_MAX_CAP_RATE
    cap_rate_fails: bool = False

    def fails_on(self, caveat: dict[str, Any] | None) -> bool:
        """Whether ``caveat`` makes a score below_floor.

        That needs --cap-rate-fails, and more than --max-cap-rate cut off. A group's caveat taken
        from a task may be under it.
        """
        return bool(caveat and self.cap_rate_fails and caveat["cut_off"] / caveat["observations"] > self.max_cap_rate)

    def __post_init__(self) -> None:
        if finite_score(self.floor) is None:  # against NaN every score is below the floor
            raise ValueError(f"the floor must be a finite number, not {self.floor!r}")


def classify_all(
    result_dir: Path | str,
    floor: float,
    metric: str | None = None,
    higher_is_better: bool = True,
    max_cap_rate: float = ev.DEFAULT_MAX_CAP_RATE,
    cap_rate_fails: bool = False,
    now: float | None = None,
    newest_only: bool = False,
) -> list[Verdict]:
    """A verdict for every task of every run in ``result_dir`` (each results file in it and
    in its model directories, each InferenceX concurrency, each trip whose run left no
    results), in path order; with ``newest_only``, only each slot's newest run.

    Never empty: a directory with nothing to judge gives one unavailable verdict that says why.
    ``floor`` must be finite (ValueError otherwise).
    """
    options = Options(floor, metric, higher_is_better, max_cap_rate, cap_rate_fails)
    root = Path(result_dir)
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        return [_Judge(options, None).unavailable(Source(), f"{root} {what}: there are no results to judge")]
    now = time.time() if now is None else now
    held = holdings(list_candidates(root, now), read_trip_records(root, now), newest_only)
    judge = _Judge(options, held)
    verdicts: list[Verdict] = []
    try:
        concurrencies = read_meta_env(root)
    except Unreadable as error:  # which concurrencies failed cannot be told; the runs are still judged
        concurrencies = Concurrencies()
        verdicts.append(judge.unavailable(Source(), f"InferenceX's meta_env.json cannot be read: {error}"))
    verdicts += judge.inferencex(concurrencies, held)
    verdicts += [judge.unavailable(Source(c.path, concurrency=c.concurrency), c.reason or "") for c in held.unusable]
    for evaluation in held.evaluations:
        verdicts += judge.run(evaluation)
    verdicts += [judge.orphan(trip) for trip in held.orphans]
    verdicts += [judge.unavailable(Source(trip_record=r.path), f"a trip record cannot be read: {r.error}: whether its "
                                   "run was cut short cannot be told") for r in held.broken]  # fmt: skip
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
    newest_only: bool = False,
) -> Verdict:
    """The worst verdict on ``task`` (default: the first task judged) across the runs, the
    verdicts on whole evaluations included (see :func:`select`)."""
    verdicts = classify_all(result_dir, floor, metric, higher_is_better, max_cap_rate, cap_rate_fails, now,
                            newest_only)  # fmt: skip
    if task is None:
        task = next((v.task for v in verdicts if v.task is not None), None)
    chosen = select(verdicts, task) if task is not None else verdicts
    return min(chosen, key=lambda v: v.status.severity)


def select(verdicts: list[Verdict], task: str) -> list[Verdict]:
    """The verdicts on ``task``, and every verdict on a whole evaluation.

    A filter never drops what applies to it. When no run has the task, one unavailable verdict names
    the tasks there are.
    """
    chosen = [v for v in verdicts if v.task == task or v.applies_to_every_task]
    if any(v.task == task for v in chosen):
        return chosen
    names = sorted({v.task for v in verdicts if v.task is not None})
    listed = ", ".join(repr(n) for n in names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    template = chosen[0] if chosen else verdicts[0]
    missing = Verdict(
        Status.UNAVAILABLE, f"task {task!r} is in no results file here; the tasks there are: {listed or 'none'}",
        template.floor, template.higher_is_better, Source(), template.sidecar, task=task,
        evidence_status=Status.UNAVAILABLE,
    )  # fmt: skip
    return [missing, *chosen]  # fmt: skip


def worst(verdicts: Iterable[Verdict]) -> Status:
    """The worst status among ``verdicts`` (unavailable, then below_floor, then ok)."""
    return Status.worst(v.status for v in verdicts)


class _Judge:
    """The rules, applied to the runs of one directory with the options of one ``read``."""

    def __init__(self, options: Options, held: Holdings | None) -> None:
        self.options = options
        self.sidecar = held.sidecar if held else Sidecar(SidecarState.ABSENT, Path(SIDECAR_NAME))
        self.view = SidecarView(self.sidecar.state, self.sidecar.path, self.sidecar.error)

    def verdict(self, source: Source, status: Status, reason: str, **fields: Any) -> Verdict:
        view = fields.pop("sidecar", self.view)
        return Verdict(status, reason, self.options.floor, self.options.higher_is_better, source, view, **fields)

    def unavailable(self, source: Source, reason: str, **fields: Any) -> Verdict:
        return self.verdict(source, Status.UNAVAILABLE, reason, evidence_status=Status.UNAVAILABLE, **fields)

    def no_results(self, root: Path) -> Verdict:
        """Nothing to judge at all: unavailable, with the reason."""
        missing = f"no results file under {root} {_NO_RESULTS}"
        if self.sidecar.state is SidecarState.UNREADABLE:
            missing += f"; and the probe's sidecar is unreadable ({self.sidecar.error})"
        return self.unavailable(Source(), missing)

    def orphan(self, trip: TripContext) -> Verdict:
        """A run that tripped and left no results file: below_floor, with the trip's evidence."""
        words = trip_words(trip.record)
        return self.verdict(
            Source(run_id=trip.run_id, trip_record=trip.path, model=trip.model), Status.BELOW_FLOOR,
            f"{words.reason} (the probe tripped); and no results file of this run {_NO_RESULTS} here: it ended "
            "before lm-eval wrote one, or lm-eval wrote it elsewhere (its --output_path)", cause=words.cause,
            pathology=_pathology(trip, None),
            sidecar=SidecarView(SidecarState.VALID, trip.path), evidence_status=Status.BELOW_FLOOR,
        )  # fmt: skip

    def inferencex(self, asked: Concurrencies, held: Holdings) -> list[Verdict]:
        """A verdict for each concurrency meta_env.json records as failed or that left no results."""
        present = {c.concurrency for c in held.unusable} | {e.candidate.concurrency for e in held.evaluations}
        found = []
        for c in sorted(set(asked.failed) | (set(asked.asked) - present)):
            reason = f"InferenceX records concurrency {c} as failed" if c in asked.failed else (
                f"no results file for concurrency {c}")  # fmt: skip
            found.append(self.unavailable(Source(concurrency=c), reason))
        return found

    def run(self, evaluation: Evaluation) -> list[Verdict]:
        """The verdicts on every task of one results file, groups folded onto their tasks."""
        c, trip = evaluation.candidate, evaluation.trip
        source = Source(c.path, c.run_id or (trip.run_id if trip else None), c.started_at, c.concurrency,
                        trip.path if trip else None, c.model_name)  # fmt: skip
        results = c.results or {}
        facts = _RunFacts(c, trip)
        view = evaluation.sidecar
        rows = {name: row for name, row in results.items() if isinstance(row, dict)}
        found = [
            self.unavailable(source, f"the results row of task {name!r} is a {type(row).__name__}, not an object",
                             task=name, sidecar=view)
            for name, row in results.items() if name not in rows
        ]  # fmt: skip
        found += [
            self.unavailable(source, f"the probe's records name task {name!r} as cut short, but {c.path.name} has "
                             "no results row for it: the evidence contradicts itself", task=name, sidecar=view)
            for name in sorted(facts.cut_short - set(results) - c.superseded)
        ]  # fmt: skip
        # A group follows every row of its tasks, those that cannot be judged included.
        judged = {v.task or "": v for v in found}
        judged.update((name, self.task(source, evaluation, facts, name, row)) for name, row in rows.items())
        if not judged:
            return [self.unavailable(source, f"no task in {c.path.name}", sidecar=view)]
        return list(_fold_groups(judged, c.subtasks or {}, self).values())

    def task(self, source: Source, evaluation: Evaluation, facts: _RunFacts, task: str, metrics: dict) -> Verdict:
        """A task's verdict. It rests only on what lm-eval measured (a metric it computed, never a
        count or a placeholder) and on the evidence of this run."""
        options, c = self.options, evaluation.candidate
        directions = None if c.directions is None else c.directions.get(task)
        metric, unchosen = (options.metric, "") if options.metric else pick_metric(metrics, directions)
        value = finite_score(metrics.get(metric)) if metric in metrics else None
        figures = facts.figures.get(task)
        base = {"task": task, "metric": metric, "score": value, "evidence": figures, "cap_rate": ev.cap_rate(figures),
                "sidecar": evaluation.sidecar}  # fmt: skip
        if task in c.split_groups:
            return self.unavailable(source, "a task of this group was re-run into a newer results file (read "
                                    "--newest): the group's own row no longer stands for its tasks, judge them by "
                                    "their rows", **base)  # fmt: skip
        if task in (c.subtasks or {}) and not measured(metrics, None) and metric not in metrics:
            return self.verdict(source, Status.OK, "a group without a score of its own", follows_tasks=True, **base)
        if self.sidecar.state is SidecarState.UNREADABLE:
            return self.unavailable(source, f"the probe's sidecar is unreadable ({self.sidecar.error}): whether the "
                                    "run was cut short cannot be told", **base)  # fmt: skip
        if facts.marks(task):
            words = trip_words(facts.trip.record if facts.trip else None)
            missing = "" if value is not None else f"; and no finite score for {metric!r}" if metric else (
                "; and no score lm-eval measured")  # fmt: skip
            return self.verdict(source, Status.BELOW_FLOOR, f"{words.reason} (the probe cut this task short){missing}",
                                cause=words.cause, pathology=_pathology(facts.trip, figures),
                                evidence_status=Status.BELOW_FLOOR, **base)  # fmt: skip
        if facts.may_have_blanked(task):
            return self.unavailable(source, "the probe cut part of this run short, and whether this task was among "
                                    "what it cut is not recorded", **base)  # fmt: skip
        if metric is None:
            return self.unavailable(source, unchosen, **base)
        if metric not in metrics:
            return self.unavailable(source, f"metric {metric!r} is not in task {task!r}", **base)
        if value is None:
            return self.unavailable(source, f"the score {metrics.get(metric)!r} is not a finite number", **base)
        if options.metric and metric not in measured(metrics, directions):
            return self.unavailable(source, f"{metric!r} is not a metric lm-eval measured for task {task!r} (a count, "
                                    "a standard error or a placeholder)", **base)  # fmt: skip
        higher = (directions or {}).get(metric.split(",")[0], options.higher_is_better)
        if higher is not options.higher_is_better:
            side, flag = ("lower", "with") if options.higher_is_better else ("higher", "without")
            how = (
                f"read it {flag} --lower-is-better"
                if options.metric
                else f"choose it with --metric, {flag} --lower-is-better"
            )
            return self.unavailable(source, f"lm-eval records {side} as better for {metric!r}: {how}, and a floor on "
                                    "its scale", **base)  # fmt: skip
        unseen = self.unobserved(c, task, figures)
        if unseen and c.evidence is not None:  # a rate over the generations it saw is not the task's
            base["cap_rate"] = None
        if unseen and options.cap_rate_fails:
            return self.unavailable(source, f"{unseen}: its cap rate is unknown, and --cap-rate-fails lets none "
                                    "through", **base)  # fmt: skip
        if unseen and c.evidence is not None:
            return self.score(source, value, figures, self.caveat(figures, value),
                              unknown=f"{unseen}: its cap rate is unknown", **base)  # fmt: skip
        return self.score(source, value, figures, self.caveat(figures, value), **base)

    @staticmethod
    def unobserved(c: Any, task: str, figures: dict | None) -> str:
        """Why the probe missed some generations lm-eval scored for a generate task, or "".

        Examples are an unprobed run, or answers replayed from lm-eval's cache, which reach no
        model.
        """
        if task not in c.generate_tasks:
            return ""
        if c.evidence is None:
            return "the probe did not watch this run (its results file holds no evidence of the probe)"
        if figures is None:
            return "the probe observed none of this task's generations (answers replayed from lm-eval's cache?)"
        seen, scored = figures.get("generate_requests"), c.samples.get(task)
        if isinstance(seen, int) and isinstance(scored, int) and seen < scored:
            return (f"the probe observed {seen} of the {scored} generations lm-eval scored (the rest replayed "
                    "from lm-eval's cache?)")  # fmt: skip
        return ""

    def caveat(self, figures: dict | None, value: float, force: bool = False) -> dict[str, Any] | None:
        """The caveat due to a score built on ``figures`` (with ``force``, whatever the cap rate)."""
        options = self.options
        return ev.caveat(figures, value, options.higher_is_better, options.max_cap_rate, force) if figures else None

    def score(
        self, source: Source, value: float, figures: dict | None, caveat: dict | None, unknown: str = "", **base: Any
    ) -> Verdict:
        """The verdict a finite score gets.

        It comes with its caveat (None when none is due) and ``unknown``: why its cap rate is not
        known, if it is not.
        """
        options = self.options
        quiet = ev.silence(figures) if figures else None
        cause = quiet and "did not answer"
        if caveat:
            cause = cause or f"cut off: {ev.cause_text(caveat)}"
        notes = "".join(f"; {note}" for note in (quiet, caveat and caveat["text"], unknown) if note)
        fields = {**base, "cause": cause, "caveat": caveat}
        if options.fails_on(caveat):
            return self.verdict(source, Status.BELOW_FLOOR, f"{caveat['cut_off']} of {caveat['observations']} "
                                f"generations were cut off, more than --max-cap-rate {options.max_cap_rate:g}{notes}",
                                evidence_status=Status.BELOW_FLOOR, **fields)  # fmt: skip
        if accuracy_meets_floor(value, options.floor, options.higher_is_better):
            return self.verdict(source, Status.OK, f"the score meets the floor{notes}", **fields)
        return self.verdict(source, Status.BELOW_FLOOR, f"the score is below the floor{notes}", **fields)


class _RunFacts:
    """What one run's evidence and trip record say, computed once per run.

    They give each task's figures, the tasks a trip cut short, and whether the mapping to tasks is
    known.
    """

    def __init__(self, candidate: Candidate, trip: TripContext | None) -> None:
        evidence = candidate.evidence or {}
        self.trip = trip
        self.figures: dict[str, dict[str, Any]] = evidence.get("tasks", {})
        named = trip.named_tasks() if trip else set()
        if trip is not None and not named:
            named = None  # a trip that names no task it cut: which tasks it cut cannot be told
        self.cut_short = {name for name, figures in self.figures.items() if figures["tripped"]} | (named or set())
        tripped = trip is not None or evidence.get("tripped") is True
        self.unknown = tripped and (named is None or ev.blanked_unattributed(evidence))
        # A task's figures clear it only when the process that wrote them saw the trip; else
        # another process of the run (a data-parallel worker, say) may have blanked it.
        self.saw_trip = evidence.get("tripped") is True
        self.only_task = len([r for r in (candidate.results or {}).values() if isinstance(r, dict)]) == 1

    def marks(self, task: str) -> bool:
        """Whether this task was cut short (or, when the mapping is unknown, is the only task)."""
        return task in self.cut_short or (self.unknown and self.only_task)

    def may_have_blanked(self, task: str) -> bool:
        figures = self.figures.get(task)
        return self.unknown and not (self.saw_trip and figures and not figures["short_circuited"])


def _fold_groups(verdicts: dict[str, Verdict], subtasks: dict[str, list[str]], judge: _Judge) -> dict[str, Verdict]:
    """Each group's verdict, never better than its worst task, caveats included.

    A group's figures are the sums of its tasks' (its caveat and cap rate come from them);
    its status is the worse of what its own score says and what its tasks' evidence says
    (cut short, unavailable, over --max-cap-rate with --cap-rate-fails; a task merely under
    the floor says nothing of the group's own score). Nested groups follow their subgroups.
    Each group is folded once, after its members: linear in groups plus memberships.
    """
    done: set[str] = set()
    for start in subtasks:
        # Iterative post-order walk; a cycle (a damaged file) is cut where it closes.
        stack, entered = [(start, False)], set()
        while stack:
            group, ready = stack.pop()
            if group in done or (not ready and group in entered):
                continue
            if not ready:
                entered.add(group)
                stack.append((group, True))
                stack.extend((m, False) for m in subtasks.get(group, ()) if m in subtasks and m not in done)
                continue
            done.add(group)
            if group in verdicts:
                members = [verdicts[m] for m in subtasks[group] if m in verdicts and m != group]
                verdicts[group] = _fold(verdicts[group], members, judge, subtasks)
    return verdicts


def _fold(group: Verdict, members: list[Verdict], judge: _Judge, groups: dict[str, list[str]]) -> Verdict:
    if group.follows_tasks:
        return _follow(group, members, groups)
    if not members:
        return group
    figures = ev.summed([m.evidence for m in members if m.evidence])
    folded = group
    if group.status is not Status.UNAVAILABLE and group.pathology is None and group.score is not None and figures:
        caveat = judge.caveat(figures, group.score, force=any(m.caveat for m in members))
        folded = judge.score(group.source, group.score, figures, caveat, task=group.task, metric=group.metric,
                             score=group.score, evidence=figures, cap_rate=ev.cap_rate(figures),
                             sidecar=group.sidecar)  # fmt: skip
    bad = min(members, key=lambda m: m.evidence_status.severity)
    if not bad.evidence_status.is_worse_than(folded.status):
        folded = folded.but(evidence_status=Status.worst((folded.evidence_status, bad.evidence_status)))
        cut = next((m for m in members if m.was_cut_short), None)
        if cut is None or folded.was_cut_short:
            return folded
        # As bad already (its own score is under the floor): still say that a task was cut short.
        reason = f"{folded.reason}; and {_culprit(cut, 'was cut short', groups)}"
        return folded.but(pathology=cut.pathology, cause=cut.cause, reason=reason)
    return folded.but(status=bad.evidence_status, evidence_status=bad.evidence_status, cause=bad.cause,
                      pathology=bad.pathology or folded.pathology, caveat=folded.caveat or bad.caveat,
                      reason=_culprit(bad, f"is {bad.evidence_status.value}", groups))  # fmt: skip


def _follow(group: Verdict, members: list[Verdict], groups: dict[str, list[str]]) -> Verdict:
    """A group without a score of its own: as good as its worst task, score and evidence alike."""
    if not members:
        return group.but(status=Status.UNAVAILABLE, reason="a group without a score of its own, and none of its "
                         "tasks is in the file", evidence_status=Status.UNAVAILABLE)  # fmt: skip
    figures = ev.summed([m.evidence for m in members if m.evidence])
    bad = min(members, key=lambda m: m.status.severity)
    common = {"evidence": figures, "cap_rate": ev.cap_rate(figures), "cause": bad.cause, "pathology": bad.pathology,
              "caveat": next((m.caveat for m in members if m.caveat), None)}  # fmt: skip
    if bad.status is Status.OK:
        return group.but(reason=f"a group without a score of its own: all {len(members)} of its tasks are ok",
                         evidence_status=Status.worst(m.evidence_status for m in members), **common)  # fmt: skip
    return group.but(status=bad.status, evidence_status=Status.worst(m.evidence_status for m in members),
                     reason=f"a group without a score of its own: {_culprit(bad, f'is {bad.status.value}', groups)}",
                     **common)  # fmt: skip


def _culprit(member: Verdict, what: str, groups: dict[str, list[str]]) -> str:
    """What a group says of the member it follows.

    A nested group passes on what it says of its own culprit, so the task at the bottom is named. A
    reason never grows with the depth of nesting, which keeps reading linear.
    """
    if member.task in groups and member.reason.startswith("its task "):
        return member.reason
    return f"its task {member.task!r} {what} ({member.reason})"


def _rule_view(figures: dict[str, Any]) -> dict[str, Any]:
    """What the rule counted, from a task's figures.

    A flagged generation counts once, when flagged, as pathological with cause repetition. Its
    ending, if any, is filed in ``flagged_endings`` and not counted again. Every other ending counts
    by its label.
    """
    reasons = figures.get("finish_reasons") or {}
    flagged = figures.get("flagged") or 0
    endings = figures.get("flagged_endings") or {}
    unflagged = {label: n - endings.get(label, 0) for label, n in reasons.items()}
    causes = dict(figures.get("causes") or {})
    if flagged:
        causes["repetition"] = causes.get("repetition", 0) + flagged
    return {
        "observations": sum(unflagged.values()) + flagged,
        "pathological": sum(n for label, n in unflagged.items() if is_pathological(label)) + flagged,
        "finish_reasons": reasons,
        "flagged": flagged,
        "cause": main_cause(causes),
    }


def _pathology(trip: TripContext | None, figures: dict | None) -> dict[str, Any]:
    """The evidence a cut-short verdict carries: the trip record's, else the results file's.

    ``pathological`` counts what the rule counts (``is_pathological``): a generation the
    server aborted is cut off, yet never evidence of a model that does not stop.
    """
    keys = (
        "pathology", "observations", "pathological", "ratio", "finish_reasons", "repetition", "max_tokens",
        "group", "tasks", "settings", "settings_fingerprint", "tripped_at_iso", "seconds_since_first_request", "pid",
        "lm_eval_version", "model", "base_url", "run_id", "backend", "cause", "flagged",
    )  # fmt: skip
    record = trip.record if trip else {}
    found = {k: record.get(k) for k in keys}
    if trip is None and figures is not None:  # only the results file's evidence is at hand
        found.update(_rule_view(figures), pathology=PATHOLOGY, max_tokens=figures.get("max_tokens"))
    final = trip.final if trip else None
    found["short_circuited_requests"] = final.get("short_circuited_requests") if final else None
    found["cancelled_in_flight"] = final.get("cancelled_in_flight") if final else None
    if found["short_circuited_requests"] is None and figures is not None:
        found["short_circuited_requests"] = figures["short_circuited"]
        found["cancelled_in_flight"] = figures["cancelled_in_flight"]
    return found
