"""Reading the probe's sidecar: absent, unreadable, or valid, never confused."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from probe.runtime.contract import SCHEMA_VERSION, SIDECAR_NAME

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


def read_sidecar(result_dir: Path) -> Sidecar:
    """Read ``result_dir``'s sidecar. A file that exists but cannot be trusted is
    ``unreadable`` (with the reason), never absent and never healthy."""
    path = Path(result_dir) / SIDECAR_NAME
    if not path.exists():
        return Sidecar("absent", path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return Sidecar("unreadable", path, error=f"cannot parse {path}: {error}")
    problem = _schema_problem(document)
    if problem:
        return Sidecar("unreadable", path, error=f"{path}: {problem}")
    return Sidecar("valid", path, trip=document["verdict"], final=document.get("final"))


def _schema_problem(document: Any) -> str | None:
    if not isinstance(document, dict):
        return "not a JSON object"
    version = document.get("schema_version")
    if version != SCHEMA_VERSION:
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
