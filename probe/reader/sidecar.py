"""Reading the probe's sidecar: absent, unreadable, or valid, never confused."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from probe.reader.documents import Unreadable, parse_json, recorded_time
from probe.reader.files import read_regular_file
from probe.runtime.contract import SCHEMA_VERSION, SIDECAR_NAME

MAX_SIDECAR_BYTES = 2**20  # the probe writes a few KiB

State = Literal["absent", "unreadable", "valid"]
_VERDICT_FIELDS = {
    "tripped": bool,
    "pathology": str,
    "observations": int,
    "pathological": int,
    "finish_reasons": dict,
    "max_tokens": list,
    "settings": dict,
    "tripped_at": (int, float),
}


@dataclass(frozen=True)
class Sidecar:
    """What the result directory says about the probe."""

    state: State
    path: Path
    trip: dict[str, Any] = field(default_factory=dict)  # the trip record (the document's "verdict" key)
    final: dict[str, Any] | None = None
    error: str | None = None


def read_sidecar(result_dir: Path | str, now: float | None = None) -> Sidecar:
    """Read ``result_dir``'s sidecar. Anything at its path that cannot be trusted is
    ``unreadable`` (with the reason), never absent and never healthy: a dangling or outside
    link, a FIFO or other special file, more than MAX_SIDECAR_BYTES, JSON nested too deep or
    holding a non-finite number (NaN and Infinity are not JSON), a schema mismatch, or a
    ``tripped_at`` that is not a finite time or lies in the future (see ``recorded_time``)."""
    path = Path(result_dir) / SIDECAR_NAME
    try:
        os.lstat(path)  # a dangling link is something at the path, not nothing
    except FileNotFoundError:
        return Sidecar("absent", path)
    except OSError as error:
        return Sidecar("unreadable", path, error=f"{path}: {error.strerror or error}")
    try:
        document = parse_json(read_regular_file(Path(result_dir), path, MAX_SIDECAR_BYTES), finite_only=True)
        problem = _schema_problem(document)
        if problem:
            raise Unreadable(problem)
        now = time.time() if now is None else now
        recorded_time(document["verdict"]["tripped_at"], now, "tripped_at")
    except Unreadable as error:
        return Sidecar("unreadable", path, error=f"{path}: {error}")
    return Sidecar("valid", path, trip=document["verdict"], final=document.get("final"))


def _schema_problem(document: Any) -> str | None:
    if not isinstance(document, dict):
        return "not a JSON object"
    version = document.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:  # true == 1 in Python, not here
        return f"schema_version {version!r} is not the supported {SCHEMA_VERSION}"
    verdict = document.get("verdict")
    if not isinstance(verdict, dict):
        return "no verdict object"
    for name, kind in _VERDICT_FIELDS.items():
        value = verdict.get(name)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"verdict field {name!r} is missing or of the wrong type"
    final = document.get("final")
    if final is not None and not isinstance(final, dict):
        return "final is neither null nor an object"
    return None
