"""The report at exit (``HYPERLOOM_EVAL_PROBE_REPORT``, set by ``eval-probe run``): what the
evaluations of every probed process of one command observed.

A command may start many Python processes (a script that runs lm-eval, then a helper that
merely imports it). Each adds its own evaluations to the one report, under a lock, and a
process in which nothing was evaluated adds nothing: a later idle process never replaces
what lm-eval reported.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from probe.runtime.contract import ENV_REPORT, PROBE_VERSION, SCHEMA_VERSION
from probe.runtime.log import say
from probe.runtime.sidecar import write_json_atomic


def read_report(path: str) -> list[dict[str, Any]]:
    """The evaluations a report lists, oldest first; [] when it is absent or not a report."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError):
        return []
    evaluations = document.get("evaluations") if isinstance(document, dict) else None
    return [e for e in evaluations if isinstance(e, dict)] if isinstance(evaluations, list) else []


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock beside ``path`` (where fcntl exists; elsewhere none is taken)."""
    with open(f"{path}.lock", "a", encoding="utf-8") as lock:
        try:
            import fcntl

            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        except ImportError:
            pass
        yield  # the lock goes with the file when it is closed


def add_to_report(path: str, evaluations: list[dict[str, Any]]) -> None:
    """Append ``evaluations`` to the report at ``path``, keeping what other processes wrote."""
    with _locked(path):
        listed = read_report(path) + evaluations
        write_json_atomic(
            path, {"schema_version": SCHEMA_VERSION, "probe_version": PROBE_VERSION, "evaluations": listed}
        )


def write_report_at_exit(scopes: Iterable[Any]) -> None:
    """Add this process's evaluations (its scopes that saw anything) to the report, if one is
    asked for; never raises."""
    path = os.environ.get(ENV_REPORT)
    if not path:
        return
    try:
        evaluations = [scope.evidence_document() for scope in scopes if not scope.idle()]
        if evaluations:
            add_to_report(path, evaluations)
    except Exception as error:
        say(f"could not write the observation report {path}: {error!r}")
