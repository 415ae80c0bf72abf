"""The reader's types (pure).

They hold a verdict's status, where it comes from, the trip behind it, and the verdict with its one
JSON form.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any


class Status(str, Enum):
    """A verdict's status; its exit code is ``probe.exitcodes.READ_STATUS[status.value]``."""

    OK = "ok"
    BELOW_FLOOR = "below_floor"
    UNAVAILABLE = "unavailable"

    @property
    def severity(self) -> int:
        """0 for the worst status (unavailable), 2 for ok: the exit code of several verdicts
        is the worst one's."""
        return _SEVERITY[self]

    def is_worse_than(self, other: Status) -> bool:
        return self.severity < other.severity

    @staticmethod
    def worst(statuses: Iterable[Status]) -> Status:
        """The worst of ``statuses``; ok when there is none."""
        return min(statuses, key=_SEVERITY.__getitem__, default=Status.OK)


_SEVERITY = {Status.UNAVAILABLE: 0, Status.BELOW_FLOOR: 1, Status.OK: 2}


class SidecarState(str, Enum):
    """What a trip record is to the run a verdict judges. A file is read as absent,
    unreadable or valid; a valid record then belongs to that run, to another run, or (for
    results without a run id) predates it."""

    ABSENT = "absent"
    UNREADABLE = "unreadable"
    VALID = "valid"
    ANOTHER_RUNS = "another run's"
    STALE = "stale"


@dataclass(frozen=True)
class TripContext:
    """A trip record that applies to one run, and the file it was read from.

    ``trip`` is the sidecar's ``verdict``. ``final`` holds its final counters, None until the
    process exited.
    """

    record: Mapping[str, Any]
    final: Mapping[str, Any] | None
    path: Path

    @property
    def run_id(self) -> str | None:
        value = self.record.get("run_id")
        return value if isinstance(value, str) else None

    @property
    def tripped_at(self) -> float:
        return float(self.record["tripped_at"])

    @property
    def model(self) -> str | None:
        value = self.record.get("model")
        return value if isinstance(value, str) else None

    def named_tasks(self) -> set[str] | None:
        """The tasks the record and its final counters name as cut short.

        None when the record names none at all (an older probe): the mapping cannot be told.
        """
        listed = self.record.get("tasks")
        if not isinstance(listed, list):
            return None
        found = {t for t in listed if isinstance(t, str)}
        groups = (self.final or {}).get("short_circuited_groups")
        for group in groups if isinstance(groups, list) else []:
            tasks = group.get("tasks") if isinstance(group, dict) else None
            found |= {t for t in tasks if isinstance(t, str)} if isinstance(tasks, list) else set()
        return found


@dataclass(frozen=True)
class Source:
    """Where a verdict comes from.

    That is the results file, the run that wrote it (run id and recorded start), InferenceX's
    concurrency, and the trip record it was judged with.
    """

    results_file: Path | None = None
    run_id: str | None = None
    started_at: float | None = None
    concurrency: int | None = None
    trip_record: Path | None = None
    model: str | None = None  # lm-eval's model_name, where the results file records one


@dataclass(frozen=True)
class SidecarView:
    """The trip record as the verdict saw it (the JSON's ``sidecar``)."""

    state: SidecarState
    path: Path
    error: str | None = None


@dataclass(frozen=True)
class Verdict:
    """One verdict: its status, the reason, and what it rests on.

    It covers one task of one run. With ``task`` None, it covers a whole evaluation with nothing to
    judge per task.
    """

    status: Status
    reason: str
    floor: float
    higher_is_better: bool
    source: Source
    sidecar: SidecarView
    task: str | None = None
    metric: str | None = None
    score: float | None = None
    cap_rate: float | None = None
    cause: str | None = None
    caveat: dict[str, Any] | None = None
    evidence: dict[str, Any] | None = None
    pathology: dict[str, Any] | None = None
    # What the evidence alone says, the score apart: a group follows its tasks on this, not
    # on a score merely under the floor. Not part of the JSON.
    evidence_status: Status = field(default=Status.OK, compare=False)
    # A group without a score of its own: it takes its tasks' verdicts. Not part of the JSON.
    follows_tasks: bool = field(default=False, compare=False)

    @property
    def was_cut_short(self) -> bool:
        """Whether the probe cut this task (or run) short: the verdict carries its evidence."""
        return self.pathology is not None

    @property
    def applies_to_every_task(self) -> bool:
        """Whether this verdict is on a whole evaluation, so a task filter keeps it.

        Examples: a failed concurrency, an unreadable file, a run that left no results.
        """
        return self.task is None

    def but(self, **changes: Any) -> Verdict:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The verdict as ``read --json`` prints it (strict JSON: no NaN, no infinity)."""
        return {
            "status": self.status.value,
            "reason": self.reason,
            "task": self.task,
            "metric": self.metric,
            "score": self.score,
            "cap_rate": self.cap_rate,
            "cause": self.cause,
            "caveat": self.caveat,
            "evidence": self.evidence,
            "pathology": self.pathology,
            "floor": self.floor,
            "higher_is_better": self.higher_is_better,
            "model": self.source.model,
            "concurrency": self.source.concurrency,
            "results_file": _text(self.source.results_file),
            "run_id": self.source.run_id,
            "started_at": self.source.started_at,
            "trip_record": _text(self.source.trip_record),
            "sidecar": {"state": self.sidecar.state.value, "path": str(self.sidecar.path), "error": self.sidecar.error},
        }


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)
