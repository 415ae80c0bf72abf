"""The patcher's file operations: patch, check, unpatch or preview benchmark_lib.sh."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from patcher import benchlib
from patcher.payload import Payload
from patcher.safewrite import bash_syntax_error, locked, read_text, replace, target


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
    """Insert (or upgrade, or restore) the probe block in ``path``; idempotent.

    A symlink is followed: its target is changed and the link is kept.
    """
    real = target(path)
    with locked(real):
        text = read_text(real)
        new = _patched(text, payload)
        if dry_run:
            return Outcome(
                0, _diff(path, text, new, "patched") or f"{path}: already patched with this body; nothing would change"
            )
        if new == text:
            return Outcome(0, f"{path}: already patched with {payload.label}")
        before = benchlib.status(text)
        replace(real, new, bash_syntax_error)
    if not before.patched:
        return Outcome(0, f"{path}: patched to {payload.label}")
    if before.digest == payload.digest:
        return Outcome(0, f"{path}: block restored to {payload.label} (it had been edited by hand, or moved)")
    return Outcome(0, f"{path}: upgraded from {before.version} (body {before.digest}) to {payload.label}")


def unpatch_file(path: Path, dry_run: bool = False) -> Outcome:
    """Remove the probe block from ``path`` (a symlink's target), restoring it byte for byte."""
    real = target(path)
    with locked(real):
        text = read_text(real)
        new = benchlib.unpatch(text)
        if new == text:
            return Outcome(0, f"{path}: not patched; nothing to remove")
        if dry_run:
            return Outcome(0, _diff(path, text, new, "unpatched"))
        replace(real, new, bash_syntax_error)
    return Outcome(0, f"{path}: lm-eval-probe block removed")


def check_file(path: Path, payload: Payload) -> Outcome:
    """Exit 0 when ``path`` holds exactly the block ``patch`` would write now, 1 otherwise.

    The whole block is compared, not only its marker: a block edited by hand is not current.
    """
    text = read_text(target(path))
    found = benchlib.status(text)
    if not found.patched:
        return Outcome(1, f"{path}: not patched (run: eval-probe patch {path})")
    if found.digest != payload.digest:
        return Outcome(
            1,
            f"{path}: patched with lm-eval-probe {found.version} (body {found.digest}), but this is "
            f"{payload.label}; run: eval-probe patch {path}",
        )
    if _patched(text, payload) != text:
        return Outcome(
            1,
            f"{path}: its lm-eval-probe block says {payload.label} but was edited by hand (or moved away from "
            f"its anchor); run: eval-probe patch {path} to restore it",
        )
    return Outcome(0, f"{path}: patched with the current lm-eval-probe {found.version} (body {found.digest})")
