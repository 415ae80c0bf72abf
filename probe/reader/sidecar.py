"""Reading the probe's trip records: the sidecar and the records later runs moved aside
(``hyperloom_eval_probe.json.stale-<time>[-n]``); each absent, unreadable or valid, never
confused. What is valid is the runtime's own definition (``trip_record_problem``)."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.reader.documents import Unreadable, parse_json
from probe.reader.files import list_directory, read_regular_file, resolve_inside
from probe.reader.model import SidecarState
from probe.runtime.core.contract import SIDECAR_NAME
from probe.runtime.core.sidecar import MAX_SIDECAR_BYTES, trip_record_problem

# The names the runtime moves another run's sidecar to (ownership._move_aside).
_MOVED_ASIDE = re.compile(re.escape(SIDECAR_NAME) + r"\.stale-(?:\d+|bad-time)(?:-\d+)?", re.ASCII)


@dataclass(frozen=True)
class Sidecar:
    """One trip record file, as read.

    ``state`` is absent, unreadable (``error`` says why) or valid. When valid, ``trip`` is the
    document's ``verdict`` and ``final`` its final counters.
    """

    state: SidecarState
    path: Path
    trip: dict[str, Any] = field(default_factory=dict)
    final: dict[str, Any] | None = None
    error: str | None = None

    @property
    def records_a_trip(self) -> bool:
        return self.state is SidecarState.VALID and self.trip.get("tripped") is True


def read_sidecar(result_dir: Path | str, now: float | None = None) -> Sidecar:
    """Read ``result_dir``'s sidecar.

    Anything at its path that cannot be trusted is ``unreadable``, with the reason. It is never
    absent and never healthy. The cases are listed in docs/reading.md.
    """
    return read_trip_record(Path(result_dir), Path(result_dir) / SIDECAR_NAME, now)


def read_trip_records(result_dir: Path | str, now: float | None = None) -> list[Sidecar]:
    """Every trip record of ``result_dir`` and its subdirectories, absent ones left out.

    Each directory gives its sidecar, then the records moved aside beside it, in name order. When
    ``result_dir`` cannot be listed, its sidecar is unreadable. A subdirectory that cannot be read
    is skipped here: the results reader already reports it. See docs/reading.md.
    """
    root = Path(result_dir)
    now = time.time() if now is None else now
    try:
        entries = list_directory(root)
    except Unreadable as error:
        return [Sidecar(SidecarState.UNREADABLE, root / SIDECAR_NAME, error=f"{root}: {error}")]
    found = [read_sidecar(root, now), *_moved_aside(root, root, entries, now)]
    for entry in entries:
        if not _is_directory(entry):
            continue
        directory = Path(entry.path)
        try:
            resolve_inside(root, directory)
            inner = list_directory(directory)
        except Unreadable:
            continue  # the results reader makes it an unavailable row of its own (list_candidates)
        own = read_trip_record(root, directory / SIDECAR_NAME, now)
        found += [own] if own.state is not SidecarState.ABSENT else []
        found += _moved_aside(root, directory, inner, now)
    return found


def _moved_aside(root: Path, directory: Path, entries: list[os.DirEntry[str]], now: float) -> list[Sidecar]:
    names = sorted(e.name for e in entries if _MOVED_ASIDE.fullmatch(e.name))
    return [read_trip_record(root, directory / name, now) for name in names]


def _is_directory(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows a link: a linked model directory counts
    except OSError:
        return False  # the results reader reports what cannot be examined


def read_trip_record(root: Path, path: Path, now: float | None = None) -> Sidecar:
    """The trip record file at ``path`` inside ``root``, judged as :func:`read_sidecar` says."""
    try:
        os.lstat(path)  # a dangling link is something at the path, not nothing
    except (FileNotFoundError, NotADirectoryError):  # nothing there, nor can be (a file where a directory is)
        return Sidecar(SidecarState.ABSENT, path)
    except OSError as error:
        return Sidecar(SidecarState.UNREADABLE, path, error=f"{path}: {error.strerror or error}")
    try:
        document = parse_json(read_regular_file(root, path, MAX_SIDECAR_BYTES), finite_only=True)
        problem = trip_record_problem(document, time.time() if now is None else now)
        if problem:
            raise Unreadable(problem)
    except Unreadable as error:
        return Sidecar(SidecarState.UNREADABLE, path, error=f"{path}: {error}")
    return Sidecar(SidecarState.VALID, path, trip=document["verdict"], final=document.get("final"))
