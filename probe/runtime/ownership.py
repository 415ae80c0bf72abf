"""Owning the sidecar: who wrote it, and adding the final counters at exit."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from probe.runtime.sidecar import existing_trip_time, write_json_atomic, write_sidecar_once


class SidecarOwnership:
    """Claims the sidecar once per process; remembers what it wrote so it can finalise it."""

    def __init__(self, started_at: float) -> None:
        self.started_at = started_at
        self.path: str | None = None  # once this process owns the sidecar
        self.document: dict[str, Any] | None = None

    def claim(self, path: str, document: dict[str, Any]) -> str:
        """Write ``document`` at ``path`` unless this run already has a sidecar there.

        Returns where the trip record now is, in words. Raises OSError when it cannot be
        written (the caller then applies nothing).
        """
        if self.path is not None:
            return f"sidecar (already written by this process): {self.path}"
        if write_sidecar_once(path, document):
            self._own(path, document)
            return f"sidecar: {path}"
        existing = existing_trip_time(path)
        if existing is not None and existing < self.started_at:
            # Left by an earlier run: stale evidence must not stand in for this run's.
            # Renaming it away first keeps "first writer wins" among this run's processes.
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, f"{path}.stale-{int(existing)}")
            if write_sidecar_once(path, document):
                self._own(path, document)
                return f"sidecar: {path} (an earlier run's sidecar was renamed to {path}.stale-{int(existing)})"
        return f"sidecar already written by another process of this run: {path}"

    def _own(self, path: str, document: dict[str, Any]) -> None:
        self.path = path
        self.document = document

    def finalise(self, final: dict[str, Any]) -> None:
        """Rewrite the sidecar this process wrote once, adding ``final``."""
        if self.path is None or self.document is None:
            return
        write_json_atomic(self.path, {**self.document, "final": final})
        self.document = None
