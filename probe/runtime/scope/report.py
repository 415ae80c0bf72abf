"""The report (``HYPERLOOM_EVAL_PROBE_REPORT``, set by ``eval-probe run``) of one command.

It holds what every probed process's evaluations observed, each added as it ends.
Processes add to the one report under a lock, keeping what others wrote.
A process that evaluated nothing adds nothing. See docs/cli.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from probe.runtime.core.contract import ENV_REPORT, PROBE_VERSION, SCHEMA_VERSION
from probe.runtime.core.sidecar import unique_keys, write_json_atomic
from probe.runtime.scope.log import say


def _open(path: str, flags: int) -> int:
    """``os.open`` that never blocks on a FIFO or a device: OSError for anything but a
    regular file (a process must never hang at exit on its report)."""
    fd = os.open(path, flags | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(f"{path} is not a regular file")
    return fd


# No command's evaluations come near this (each adds tens of kilobytes); past it the file is no
# report the probe wrote, and is never loaded whole.
MAX_REPORT_BYTES = 64 << 20
# How long a process waits for the report's lock before it gives up writing (and says so).
LOCK_WAIT_S = 10.0
_APPEND = os.O_WRONLY | os.O_CREAT | os.O_APPEND


def _read(path: str) -> Any:
    """The JSON document at ``path``; None when absent; OSError or ValueError when unreadable,
    larger than MAX_REPORT_BYTES, or holding a key twice in one object (``unique_keys``)."""
    try:
        fd = _open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, encoding="utf-8") as handle:
        if os.fstat(handle.fileno()).st_size > MAX_REPORT_BYTES:
            raise ValueError(f"{path} is larger than {MAX_REPORT_BYTES} bytes")
        return json.load(handle, object_pairs_hook=unique_keys)


def read_report(path: str) -> list[dict[str, Any]]:
    """The evaluations a report lists, oldest first; [] when it is absent or not a report."""
    try:
        document = _read(path)
    except Exception:  # any file may sit there: OSError, ValueError, JSON nested too deep, a device's reads
        return []
    version = document.get("schema_version") if isinstance(document, dict) else None
    if type(version) is not int or version != SCHEMA_VERSION:  # True and 1.0 equal 1, and are none
        return []
    evaluations = document.get("evaluations")
    # Each one an object, as the probe writes them: else it is no report (a trip could hide in it).
    return evaluations if isinstance(evaluations, list) and all(isinstance(e, dict) for e in evaluations) else []


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock beside ``path`` (where fcntl exists; elsewhere none is taken)."""
    with os.fdopen(_open(f"{path}.lock", _APPEND), "a") as lock:
        try:
            import fcntl
        except ImportError:
            fcntl = None
        # Bounded: a process that holds the lock for good must not hold lm-eval's exit with it.
        deadline = time.monotonic() + LOCK_WAIT_S
        while fcntl is not None:
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OSError(f"{path}.lock stayed held for {LOCK_WAIT_S:g} s") from None
                time.sleep(0.05)
        yield  # the lock goes with the file when it is closed


def add_to_report(path: str, evaluations: list[dict[str, Any]]) -> None:
    """Append ``evaluations`` to the report at ``path``, keeping what other processes wrote.

    Where something else is there, it raises OSError and writes nothing.
    Replacing it could drop another process's trip; left as it is, ``eval-probe run`` says it cannot tell.
    """
    with _locked(path):
        if os.path.lexists(path) and not os.path.isfile(path):
            raise OSError(f"{path} is not a regular file; it is left as it is")
        earlier = read_report(path)
        if not earlier and os.path.lexists(path):  # the probe never writes a report without evaluations
            raise OSError(f"{path} holds something that is not a report this probe writes; it is left as it is")
        listed = earlier + evaluations
        write_json_atomic(
            path, {"schema_version": SCHEMA_VERSION, "probe_version": PROBE_VERSION, "evaluations": listed}
        )


def _note(entry: dict[str, Any], report: str | None = None, beside: str = ".active") -> None:
    """Add ``entry`` as one line beside the report (``report``, else the one ``eval-probe run``
    named: ``REPORT.active``, or ``beside``); never raises."""
    path = report or os.environ.get(ENV_REPORT)
    if path:
        with contextlib.suppress(OSError, ValueError, TypeError):
            line = json.dumps(entry)
            with os.fdopen(_open(f"{path}{beside}", _APPEND), "a") as noted:
                noted.write(line + "\n")


def note_trip(run_id: str, sidecar: str) -> None:
    """Note that evaluation ``run_id`` is about to write its trip record at ``sidecar``: the
    record is then known as the command's even if its process is killed before it reports."""
    _note({"tripping": run_id, "sidecar": sidecar})


def note_not_applied(run_id: str) -> None:
    """Note that the trip of ``run_id`` was not applied (its record could not be written)."""
    _note({"not_applied": run_id})


def note_saved(run_id: str, results: str) -> None:
    """Note that lm-eval saved the results of ``run_id`` in the directory ``results`` (absolute)."""
    _note({"run_id": run_id, "saved": results})


def note_nested(outer: str, inner: str) -> None:
    """Note, beside the report at ``outer``, that an ``eval-probe run`` inside it reports to
    ``inner``: the outer one reads it too, even when the inner one is killed. Not in
    ``REPORT.active``, whose existence says that the probe was active in the command."""
    _note({"nested": inner}, outer, ".nested")


@dataclass
class Notes:
    """What the processes of one command noted beside its report: the trips about to be written
    (run identity: where), where lm-eval saved results (run identity: paths), and the reports of
    ``eval-probe run`` commands nested in it. Any process may write there: only well-formed
    entries count, and a path only when it prints as one line."""

    tripping: dict[str, str | None] = field(default_factory=dict)
    saved: dict[str, list[str]] = field(default_factory=dict)
    nested: list[str] = field(default_factory=list)


def read_notes(path: str) -> Notes:
    """The notes beside the report at ``path``, in the order they were written (a trip noted,
    then not applied, is not noted)."""
    notes = Notes()
    for line in _noted(path) + _noted(path, ".nested"):
        if _is_run_id(line):  # a trip noted by identity alone
            notes.tripping[line] = None
            continue
        with contextlib.suppress(ValueError, RecursionError):
            entry = json.loads(line) if line.startswith("{") else None
            if not isinstance(entry, dict):
                continue
            where = next((entry[k] for k in ("sidecar", "saved", "nested") if _a_path(entry.get(k))), None)
            if _is_run_id(entry.get("tripping")):
                notes.tripping[entry["tripping"]] = where
            elif _is_run_id(entry.get("not_applied")):
                notes.tripping.pop(entry["not_applied"], None)
            elif _is_run_id(entry.get("run_id")) and where:
                notes.saved.setdefault(entry["run_id"], []).append(where)
            elif where and "nested" in entry:
                notes.nested.append(where)
    return notes


def _noted(path: str, beside: str = ".active") -> list[str]:
    """The lines beside the report at ``path`` (in ``path + beside``)."""
    try:
        with os.fdopen(_open(f"{path}{beside}", os.O_RDONLY), encoding="utf-8", errors="replace") as noted:
            return noted.read(MAX_REPORT_BYTES).splitlines()
    except OSError:
        return []


def _is_run_id(value: object) -> bool:
    # What a run identity looks like (a random hex id and a pid): any process may write there.
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{1,64}\.[0-9]{1,10}", value, re.ASCII) is not None


def _a_path(value: object) -> bool:
    """An absolute path that prints as one line (U+FFFD is what undecodable bytes became)."""
    return isinstance(value, str) and os.path.isabs(value) and value.isprintable() and "\ufffd" not in value


def noted_trips(path: str) -> set[str]:
    """The run identities whose trip was noted beside the report at ``path``, and not withdrawn."""
    return set(read_notes(path).tripping)


def mark_active() -> None:
    """Under ``eval-probe run``: ``REPORT.active`` says the probe was active (installed on
    lm-eval or vLLM) in a process of the command; never raises."""
    path = os.environ.get(ENV_REPORT)
    if path:
        with contextlib.suppress(OSError):
            os.close(_open(f"{path}.active", os.O_WRONLY | os.O_CREAT))


def settle(scopes: Iterable[Any]) -> None:
    """Add the final counters to the sidecars ``scopes`` wrote, and their evaluations (those
    that saw anything) to the report, if one is asked for; never raises. Called as each
    evaluation ends, and at exit for the rest."""
    scopes = list(scopes)
    for scope in scopes:
        try:
            scope.finalise()
        except Exception as error:
            say(f"could not add the final counters to the sidecar: {error!r}")
    path = os.environ.get(ENV_REPORT)
    if not path:
        return
    try:
        evaluations = [scope.evidence_document() for scope in scopes if not scope.idle()]
        if evaluations:
            add_to_report(path, evaluations)
    except Exception as error:
        say(f"could not write the observation report {path}: {error!r}")


def forward_report(path: str, outer: str) -> None:
    """Add the report at ``path`` (its evaluations, and the notes beside it) to the report at
    ``outer``, before ``path`` goes: an ``eval-probe run`` inside another that ends tells the
    outer one what it watched. Never raises."""
    with contextlib.suppress(OSError, ValueError):
        evaluations = read_report(path)
        if evaluations:
            add_to_report(outer, evaluations)
        for beside in (".active", ".nested"):
            if os.path.lexists(f"{path}{beside}"):
                with os.fdopen(_open(f"{outer}{beside}", _APPEND), "a") as noted:
                    noted.write("".join(f"{line}\n" for line in _noted(path, beside)))
