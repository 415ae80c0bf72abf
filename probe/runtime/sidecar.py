"""The sidecar document and how it reaches the disk: atomically, once, first writer wins."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

from probe.runtime.contract import PATHOLOGY, PROBE_VERSION, SCHEMA_VERSION, Settings, settings_fingerprint


def public_url(url: Any) -> str | None:
    """The URL without credentials or query string (which may hold an API key)."""
    if not isinstance(url, str):
        return None
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    host_and_path = rest.split("?", 1)[0].split("#", 1)[0]
    host, slash, path = host_and_path.partition("/")
    host = host.rsplit("@", 1)[-1]
    return f"{scheme}{sep}{host}{slash}{path}"


def trip_document(
    evidence: Mapping[str, Any],
    group: Mapping[str, Any],
    settings: Settings,
    first_request_at: float | None,
    lm_eval_version: str | None,
    model: Any,
    base_url: Any,
    backend: str = "api",
) -> dict[str, Any]:
    """The sidecar as written at the trip: the trip record, and ``final`` still null.

    ``backend`` says which of lm-eval's backends tripped: ``"api"`` (a server) or ``"vllm"``
    (the in-process engine of ``--model vllm``).
    """
    now = time.time()
    return {
        "schema_version": SCHEMA_VERSION,
        "probe_version": PROBE_VERSION,
        "verdict": {
            "tripped": True,
            "pathology": PATHOLOGY,
            **evidence,
            "group": dict(group),
            "settings": settings.as_dict(),
            "settings_fingerprint": settings_fingerprint(settings),
            "tripped_at": now,
            "tripped_at_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "seconds_since_first_request": round(now - (first_request_at or now), 3),
            "pid": os.getpid(),
            "lm_eval_version": lm_eval_version,
            "model": model if isinstance(model, str) else None,
            "base_url": public_url(base_url),
            "backend": backend,
        },
        "final": None,
    }


def _write_temp(path: str, document: Mapping[str, Any]) -> str:
    directory, name = os.path.split(path)
    temp = os.path.join(directory or ".", f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(temp, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    return temp


def write_sidecar_once(path: str, document: Mapping[str, Any]) -> bool:
    """Atomically create ``path`` with ``document`` unless it already exists.

    Returns True when this call created the file, False when another writer (a thread or
    another process) got there first. Raises OSError when the file cannot be written.
    The content is complete before the name appears: a reader never sees half a file.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)  # lm-eval itself creates it only at the end
    temp = _write_temp(path, document)
    try:
        os.link(temp, path)  # fails if path exists: first writer wins, across processes
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(temp)


def write_json_atomic(path: str, document: Mapping[str, Any]) -> None:
    """Atomically replace (or create) ``path`` with ``document`` as JSON."""
    temp = _write_temp(path, document)
    try:
        os.replace(temp, path)
    except OSError:
        os.unlink(temp)
        raise


def existing_trip_time(path: str) -> float | None:
    """``tripped_at`` of the sidecar at ``path``, or None when there is none to read."""
    try:
        with open(path, encoding="utf-8") as handle:
            value = json.load(handle)["verdict"]["tripped_at"]
    except Exception:
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
