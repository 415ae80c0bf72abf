"""Which evaluations a result directory holds (pure).

Every results file is paired with the trip record of its run. A trip record whose run left no
results file is an *orphan*: its run tripped, then ended before lm-eval wrote results. An orphan is
judged on its own. See docs/reading.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from probe.reader.candidates import Candidate, newest
from probe.reader.model import SidecarState, SidecarView, TripContext
from probe.reader.sidecar import Sidecar

# A trip earlier than the recorded start of a run without a run id by more than this is from
# an earlier run in the same directory.
STALE_SLACK_S = 5.0


@dataclass(frozen=True)
class Evaluation:
    """One results file to judge, with its run's trip record (None when it did not trip).

    It also says what the directory's trip records are to it.
    """

    candidate: Candidate
    trip: TripContext | None
    sidecar: SidecarView


@dataclass(frozen=True)
class Holdings:
    """Everything a result directory holds to judge.

    ``evaluations`` are the readable results. ``unusable`` are candidates that cannot be read or
    ordered, with reasons. ``orphans`` are trips whose run left no results. ``broken`` are
    moved-aside trip records that cannot be read. ``sidecar`` is the directory's own sidecar.
    """

    evaluations: list[Evaluation]
    unusable: list[Candidate]
    orphans: list[TripContext]
    broken: list[Sidecar]
    sidecar: Sidecar


def holdings(candidates: list[Candidate], records: list[Sidecar], newest_only: bool = False) -> Holdings:
    """Pair ``candidates`` with ``records``; ``records[0]`` is the directory's sidecar.

    A verdict rests only on evidence of its own run. A trip record goes to its own run, else stands
    as a row of its own. It is paired by run identity, else by time and model (``_may_own``). With
    ``newest_only``, only the newest results are kept, and a re-run supersedes an orphan trip. See
    docs/reading.md.
    """
    sidecar = records[0]
    trips = [TripContext(r.trip, r.final, r.path) for r in records if r.records_a_trip]
    readable = [c for c in candidates if c.reason is None and c.results is not None]
    unusable = [c for c in candidates if c.reason is not None or c.results is None]
    paired, orphans = _pair(readable, trips)
    shown: dict[int, set[str]] = {}  # the tasks each kept results file is shown for (all: absent)
    if newest_only:
        readable, unusable, shown, hidden = _newest_per_slot(candidates)
        superseded = _superseded_by(readable)
        orphans = [t for t in orphans if not superseded(t)]
        # The trips of runs in a slot that cannot be ordered stand on their own: never lost.
        kept = {id(t) for t in orphans}
        orphans += [paired[id(c)] for c in hidden if id(c) in paired and id(paired[id(c)]) not in kept]
        orphans = sorted({id(t): t for t in orphans}.values(), key=lambda t: t.tripped_at)
    default = _unpaired_state(sidecar)
    latest_trip = max((t.tripped_at for t in trips), default=None)
    evaluations = [
        Evaluation(_only(c, shown.get(id(c))), paired.get(id(c)), _view(paired.get(id(c)), c, latest_trip, sidecar,
                                                                          default))
        for c in sorted(readable, key=_order)
    ]  # fmt: skip
    broken = [r for r in records[1:] if r.state is SidecarState.UNREADABLE]
    return Holdings(evaluations, unusable, orphans, broken, sidecar)


def _order(candidate: Candidate) -> tuple[str, bool, int, float]:
    # By directory, then concurrency (lm-eval's own names first), then start: each series in time order.
    return str(candidate.path.parent), candidate.concurrency is not None, candidate.concurrency or 0, (
        candidate.started_at or 0.0)  # fmt: skip


def _pair(readable: list[Candidate], trips: list[TripContext]) -> tuple[dict[int, TripContext], list[TripContext]]:
    by_run: dict[str, list[Candidate]] = {}
    for candidate in readable:
        if candidate.run_id is not None:
            by_run.setdefault(candidate.run_id, []).append(candidate)
    paired: dict[int, TripContext] = {}
    unclaimed: list[TripContext] = []
    for trip in trips:
        owners = by_run.get(trip.run_id or "", [])
        for owner in owners:
            paired.setdefault(id(owner), trip)
        if not owners:
            unclaimed.append(trip)
    # Runs without a run id, latest start first; each takes at most one record: the latest
    # trip takes the latest run it may own. Trips go latest first, so a run too late for one
    # trip is too late for every later one: one pointer walks the runs once (linear).
    legacy = sorted((c for c in readable if c.run_id is None and c.started_at is not None),
                    key=lambda c: c.started_at or 0.0, reverse=True)  # fmt: skip
    orphans, next_run = [], 0
    for trip in sorted(unclaimed, key=lambda t: t.tripped_at, reverse=True):
        while next_run < len(legacy) and not _may_own(legacy[next_run], trip):
            next_run += 1
        if next_run < len(legacy):
            paired[id(legacy[next_run])] = trip
            next_run += 1
        else:
            orphans.append(trip)
    return paired, sorted(orphans, key=lambda t: t.tripped_at)


def _may_own(candidate: Candidate, trip: TripContext) -> bool:
    """Whether a run without a run identity may own ``trip``.

    It must be a probed run that started before the trip, of the same model. An unprobed run owns no
    trip. Where either names no model, whose trip it is cannot be told.
    """
    if candidate.evidence is None or candidate.model_name is None or candidate.model_name != trip.model:
        return False
    return candidate.started_at is not None and trip.tripped_at >= candidate.started_at - STALE_SLACK_S


def _all_predate(latest_trip: float | None, candidate: Candidate) -> bool:
    # ``latest_trip``: the latest tripped_at of the directory's records (None: there is none).
    return latest_trip is not None and candidate.started_at is not None and (
        latest_trip < candidate.started_at - STALE_SLACK_S)  # fmt: skip


def _newest_per_slot(
    candidates: list[Candidate],
) -> tuple[list[Candidate], list[Candidate], dict[int, set[str]], list[Candidate]]:
    """The newest results per slot, per model and per task.

    A slot is a model directory and concurrency. Returns the files kept, the unusable ones, the
    tasks each kept file is newest for (by ``id``), and the readable files of slots that cannot be
    ordered. A file that cannot be read makes its whole slot unusable. See docs/reading.md.
    """
    slots: dict[tuple[str, int | None], list[Candidate]] = {}
    for candidate in candidates:
        slots.setdefault(candidate.slot, []).append(candidate)
    readable: list[Candidate] = []
    unusable: list[Candidate] = []
    hidden: list[Candidate] = []
    shown: dict[int, set[str]] = {}
    for members in slots.values():
        if any(c.reason is not None or c.results is None for c in members):
            chosen = newest(members)
            unusable += [chosen] if chosen is not None else []
            hidden += [c for c in members if c.reason is None and c.results is not None]
            continue
        holders: dict[tuple[str | None, str], list[Candidate]] = {}
        for candidate in members:
            for task in candidate.results or {}:
                holders.setdefault((candidate.model_name, task), []).append(candidate)
        for (_, task), files in holders.items():
            chosen = newest(files)
            if chosen is None:
                continue
            twins = [c for c in files if c is not chosen and chosen.run_id is not None and c.run_id == chosen.run_id]
            if twins and chosen.reason is None:
                # One run writes one results file: another file of this run may say it was cut short.
                chosen = replace(chosen, reason=f"{chosen.path} and {twins[0].path} carry the same run id "
                                 f"{chosen.run_id!r}: which one is that run's results cannot be told")  # fmt: skip
            if chosen.reason is not None:
                if all(u.reason != chosen.reason for u in unusable):
                    unusable.append(chosen)
                continue
            if id(chosen) not in shown:
                readable.append(chosen)
            shown.setdefault(id(chosen), set()).add(task)
    return readable, unusable, shown, hidden


def _only(candidate: Candidate, tasks: set[str] | None) -> Candidate:
    """``candidate`` with only the results rows of ``tasks`` (None: all of them)."""
    results = candidate.results or {}
    if tasks is None or tasks >= set(results):
        return candidate
    groups = {g: members for g, members in (candidate.subtasks or {}).items() if g in tasks}
    split = frozenset(g for g, members in groups.items() if not set(members) <= tasks)
    return replace(candidate, results={t: row for t, row in results.items() if t in tasks}, subtasks=groups,
                   superseded=frozenset(results) - tasks, split_groups=split)  # fmt: skip


def _superseded_by(readable: Iterable[Candidate]) -> Callable[[TripContext], bool]:
    """Whether a later run supersedes a trip that left no results.

    It does when a results file of the same model, in lm-eval's own layout, started after the trip.
    That file must hold every task the trip cut short. A staged ``_conc<N>`` file never supersedes
    one: it is another evaluation.
    """
    later: dict[str, list[Candidate]] = {}
    for c in readable:
        if c.concurrency is None and c.model_name is not None and c.started_at is not None:
            later.setdefault(c.model_name, []).append(c)

    def superseded(trip: TripContext) -> bool:
        tasks = trip.record.get("tasks")
        if trip.model is None or not isinstance(tasks, list) or not tasks:
            return False  # which tasks it cut short is not recorded: never dropped
        return any((c.started_at or 0.0) > trip.tripped_at and set(tasks) <= set(c.results or {})
                   for c in later.get(trip.model, []))  # fmt: skip

    return superseded


def _unpaired_state(sidecar: Sidecar) -> SidecarState:
    return sidecar.state if sidecar.state is not SidecarState.VALID else SidecarState.ANOTHER_RUNS


def _view(
    trip: TripContext | None, candidate: Candidate, latest_trip: float | None, sidecar: Sidecar, default: SidecarState
) -> SidecarView:
    if trip is not None:
        return SidecarView(SidecarState.VALID, trip.path)
    state = default
    if state is SidecarState.ANOTHER_RUNS and candidate.run_id is None and _all_predate(latest_trip, candidate):
        # Results without a run id: records that all predate them are stale, not another run's.
        state = SidecarState.STALE
    return SidecarView(state, Path(sidecar.path), sidecar.error)
