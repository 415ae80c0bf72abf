"""Owning the sidecar: the rule that decides whether a trip may cut the run short.

A run is cut short only when a valid sidecar of this run exists.
Another run's valid sidecar is moved aside, never overwritten nor deleted.
Anything else at the path is a failed write: nothing is cut short, and the caller says so.
See docs/sidecar.md.
"""

from __future__ import annotations

import contextlib
import glob
import os
from typing import Any

from probe.runtime.core.sidecar import (
    NO_HARD_LINKS,
    read_sidecar_at,
    record_identity,
    write_json_atomic,
    write_sidecar_once,
)


class SidecarBlocked(OSError):
    """Something that is not a sidecar of any run sits at the sidecar's path."""


class SidecarOwnership:
    """Claims the sidecar for this run; remembers what this process wrote so it can finalise it."""

    def __init__(self) -> None:
        self.path: str | None = None  # once this process wrote the sidecar
        self.document: dict[str, Any] | None = None

    def claim(self, path: str, document: dict[str, Any]) -> str:
        """Make sure ``path`` holds this run's trip record; return where it is, in words.

        Raises OSError (SidecarBlocked included) when it cannot: the caller then applies
        nothing.
        """
        if self.path is not None:
            return f"sidecar (already written by this process): {self.path}"
        ours = record_identity(document)[0]
        moved = ""
        for _ in range(3):  # each round either settles it or moves one foreign sidecar aside
            if write_sidecar_once(path, document):
                self.path, self.document = path, document
                return f"sidecar: {path}{moved}"
            existing, what = read_sidecar_at(path)
            if existing is None:
                if what == "absent":
                    continue  # removed between our write and our read: try again
                raise SidecarBlocked(f"{path} already holds {what}, not a sidecar of this run")
            run, pid, _ = record_identity(existing)
            if run == ours:
                return f"sidecar written by process {pid} of this run: {path}"
            moved = f" (another run's sidecar was moved to {_move_aside(path, existing, ours)})"
        raise SidecarBlocked(f"{path} kept changing while this process tried to write it")

    def finalise(self, final: dict[str, Any]) -> str | None:
        """Add ``final`` to the sidecar this process wrote; return where, or None when it
        wrote none. Never overwrites another run's sidecar: a record moved aside by a later
        run is finalised where it now lies."""
        if self.path is None or self.document is None:
            return None
        ours = record_identity(self.document)
        for candidate in (self.path, *sorted(glob.glob(glob.escape(self.path) + ".stale-*"))):
            existing, _ = read_sidecar_at(candidate)
            if existing is not None and record_identity(existing) == ours:
                write_json_atomic(candidate, {**self.document, "final": final})
                self.document = None
                return candidate
        raise FileNotFoundError(f"this process's sidecar is no longer at {self.path} nor moved beside it")


def _move_aside(path: str, existing: dict[str, Any], run_id: str) -> str:
    """Move another run's sidecar to a free ``PATH.stale-<time>[-n]``; return that name.

    A hard link claims the new name (it fails rather than replace a file that appeared in
    the meantime); the old name goes only while it is still that same file. If what moved
    turns out to be this run's (another process of this run wrote it in between), it is
    linked back, so no process of this run loses its record.
    """
    _, _, when = record_identity(existing)
    stamp = int(when) if 0 <= when < 1e11 else "bad-time"  # a planted 1e300 makes no 300-digit name
    for n in range(1000):
        target = f"{path}.stale-{stamp}" + (f"-{n}" if n else "")
        try:
            os.link(path, target, follow_symlinks=False)
            break
        except FileExistsError:
            continue
        except OSError as error:
            if error.errno not in NO_HARD_LINKS or os.path.lexists(target):
                raise
            os.rename(path, target)  # no hard links here: the name was just seen free
            break
    else:
        raise SidecarBlocked(f"too many stale sidecars beside {path}")
    with contextlib.suppress(FileNotFoundError):
        if os.lstat(path).st_ino == os.lstat(target).st_ino:
            os.unlink(path)
    moved, _ = read_sidecar_at(target)
    if moved is not None and record_identity(moved)[0] == run_id:
        try:
            os.link(target, path)
            os.unlink(target)
        except FileExistsError:
            pass
    return target
