"""The patcher's file operations: patch, check, unpatch or preview benchmark_lib.sh."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from patcher import benchlib
from patcher.payload import Payload
from patcher.safewrite import bash_syntax_error, locked, read_text, replace


@dataclass(frozen=True)
class Outcome:
    """What an operation did, as an exit code and a line for the user."""

    code: int
    message: str


def _diff(path: Path, text: str, new: str, what: str) -> str:
    return "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), str(path), f"{path} ({what})"))


def _patched(text: str, payload: Payload) -> str:
    return benchlib.patch(text, payload.appended, payload.version, payload.digest)


def patch_file(path: Path, payload: Payload, dry_run: bool = False) -> Outcome:
    """Insert (or upgrade) the probe block in ``path``; idempotent."""
    with locked(path):
        text = read_text(path)
        new = _patched(text, payload)
        if dry_run:
            return Outcome(
                0, _diff(path, text, new, "patched") or f"{path}: already patched with this body; nothing would change"
            )
        if new == text:
            return Outcome(0, f"{path}: already patched with {payload.label}")
        before = benchlib.status(text)
        replace(path, new, bash_syntax_error)
    verb = f"upgraded from {before.version} (body {before.digest})" if before.patched else "patched"
    return Outcome(0, f"{path}: {verb} to {payload.label}")


def unpatch_file(path: Path, dry_run: bool = False) -> Outcome:
    """Remove the probe block from ``path``, restoring it byte for byte."""
    with locked(path):
        text = read_text(path)
        new = benchlib.unpatch(text)
        if new == text:
            return Outcome(0, f"{path}: not patched; nothing to remove")
        if dry_run:
            return Outcome(0, _diff(path, text, new, "unpatched"))
        replace(path, new, bash_syntax_error)
    return Outcome(0, f"{path}: lm-eval-probe block removed")


def check_file(path: Path, payload: Payload) -> Outcome:
    """Exit 0 when ``path`` holds the current probe block, 1 otherwise."""
    found = benchlib.status(read_text(path))
    if not found.patched:
        return Outcome(1, f"{path}: not patched (run: eval-probe patch {path})")
    if found.digest != payload.digest:
        return Outcome(
            1,
            f"{path}: patched with lm-eval-probe {found.version} (body {found.digest}), but this is "
            f"{payload.label}; run: eval-probe patch {path}",
        )
    return Outcome(0, f"{path}: patched with the current lm-eval-probe {found.version} (body {found.digest})")
