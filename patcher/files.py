"""The patcher's file operations: patch, check, unpatch or preview benchmark_lib.sh."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from patcher import benchlib
from patcher.safewrite import bash_syntax_error, locked, read_text, replace
from probe.body import PROBE_VERSION
from probe.inject import body_digest, sitecustomize_text


@dataclass(frozen=True)
class Outcome:
    """What an operation did, as an exit code and a line for the user."""

    code: int
    message: str


def _diff(path: Path, text: str, new: str, what: str) -> str:
    return "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), str(path), f"{path} ({what})"))


def patch_file(path: Path, dry_run: bool = False) -> Outcome:
    """Insert (or upgrade) the probe block in ``path``; idempotent."""
    digest = body_digest()
    current = f"lm-eval-probe {PROBE_VERSION} (body {digest})"
    with locked(path):
        text = read_text(path)
        new = benchlib.patch(text, sitecustomize_text(chain=False), PROBE_VERSION, digest)
        if dry_run:
            return Outcome(
                0, _diff(path, text, new, "patched") or f"{path}: already patched with this body; nothing would change"
            )
        if new == text:
            return Outcome(0, f"{path}: already patched with {current}")
        before = benchlib.status(text)
        replace(path, new, bash_syntax_error)
    verb = f"upgraded from {before.version} (body {before.digest})" if before.patched else "patched"
    return Outcome(0, f"{path}: {verb} to {current}")


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


def check_file(path: Path) -> Outcome:
    """Exit 0 when ``path`` holds the current probe block, 1 otherwise."""
    found = benchlib.status(read_text(path))
    if not found.patched:
        return Outcome(1, f"{path}: not patched (run: eval-probe patch {path})")
    if found.digest != body_digest():
        return Outcome(
            1,
            f"{path}: patched with lm-eval-probe {found.version} (body {found.digest}), but this is "
            f"{PROBE_VERSION} (body {body_digest()}); run: eval-probe patch {path}",
        )
    return Outcome(0, f"{path}: patched with the current lm-eval-probe {found.version} (body {found.digest})")
