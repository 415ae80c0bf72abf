"""Every exit code of ``eval-probe``, in one table.

The CLI returns these values. ``--help`` and the README are made from, or checked against, this
table. See docs/exit-codes.md.
"""

from __future__ import annotations

from patcher import errors

USAGE = 64  # EX_USAGE: distinct from every command's own exit codes
INTERNAL = 70  # EX_SOFTWARE: an internal error is never a verdict
INTERRUPTED = 130  # 128 + SIGINT: Ctrl-C, what a shell reports for it

# `eval-probe read`: each status maps to its code explicitly.
READ_STATUS = {"ok": 0, "below_floor": 1, "unavailable": 2}

READ = (
    (READ_STATUS["ok"], "ok: a finite score that meets the floor, and the probe did not cut the task short"),
    (READ_STATUS["below_floor"], "below_floor: a finite score under the floor (a measured 0.0 included), the probe "
     "cut the task short (a generation pathology; the evidence is printed), or a run tripped and left no results"),
    (READ_STATUS["unavailable"], "unavailable: no results (a directory that does not exist included), a file that "
     "cannot be read or ordered, no finite score, an unreadable sidecar or trip record, or evidence that "
     "contradicts itself"),
    (INTERNAL, "internal error in eval-probe itself (a bug: please report it); never a verdict"),
    (USAGE, "usage error"),
)  # fmt: skip
READ_NOTE = (
    "Every run the directory holds is judged (each results file, each InferenceX concurrency, each trip whose run "
    "left no results; --newest: each model directory's newest), and the exit code is the worst status."
)

PATCH = (
    (0, "done; with --check: patched with the current probe"),
    (errors.NOT_CURRENT, "--check only: not patched, or patched with another version (run patch again)"),
    (errors.FILE_PROBLEM, "the path (or the file a symlink points to) is missing, not a regular file, not UTF-8, or "
     "cannot be written: a read-only directory, an owner that cannot be kept, a lock not obtained"),
    (errors.NO_FUNCTION, "no _patch_lm_eval() function (or it never closes)"),
    (errors.NO_ANCHOR, "no 'export PYTHONPATH=...' command in it (one inside a here-document or a string does not "
     "count), or no sitecustomize.py written"),
    (errors.AMBIGUOUS_ANCHOR, "more than one candidate anchor, or more than one _patch_lm_eval()"),
    (errors.BASH_SYNTAX, "the patched file would fail bash -n (nothing written)"),
    (errors.DAMAGED_BLOCK, "a damaged probe block, more than one block, or a body that contains the heredoc "
     "terminator"),
    (errors.UNSURE_SHELL, "shell syntax the patcher does not follow safely (a here-document that never ends, "
     "'case' inside $(...), ...): it refuses rather than guess"),
    (INTERNAL, "internal error in eval-probe itself (a bug: please report it)"),
    (USAGE, "usage error"),
)  # fmt: skip

INSTALL = (
    (0, "done (written, appended, upgraded or already current; DIR created when only it was missing)"),
    (
        errors.FILE_PROBLEM,
        "the directory or its sitecustomize.py cannot be read or written (as for patch), DIR's "
        "parent does not exist, or DIR holds a sitecustomize package or extension module that Python would import "
        "instead of sitecustomize.py",
    ),
    (errors.DAMAGED_BLOCK, "a damaged probe block, or more than one, in the sitecustomize.py"),
    (INTERNAL, "internal error in eval-probe itself (a bug: please report it)"),
    (USAGE, "usage error"),
)

BODY = (
    (0, "printed (a reader that stops reading early, as | head does, is no error)"),
    (INTERNAL, "internal error in eval-probe itself (a bug: please report it)"),
    (USAGE, "usage error"),
)

DEMO_NOT_TRIPPED = 1
DEMO_CANNOT_RUN = 2
DEMO = (
    (0, "both runs finished and the probe tripped on the probed one"),
    (DEMO_NOT_TRIPPED, "the probe did not trip, or a run of lm-eval failed (its log is named)"),
    (DEMO_CANNOT_RUN, "the demo cannot run: lm-eval is not installed beside eval-probe, or the server at "
     "--base-url cannot be reached"),
    (INTERNAL, "internal error in eval-probe itself (a bug: please report it)"),
    (USAGE, "usage error (--model without --base-url, or the other way round)"),
    (INTERRUPTED, "interrupted (Ctrl-C), as any command can be"),
)  # fmt: skip

RUN = (
    (None, "the command's own exit code (128+N when signal N ended it)"),
    (127, "the command could not be started"),
    (USAGE, "usage error (no command given)"),
)


def epilog(table: tuple[tuple[int | None, str], ...], note: str = "") -> str:
    """The table as the 'exit codes:' section of a command's --help."""
    lines = ["exit codes:"]
    for code, meaning in table:
        lines.append(f"  {'' if code is None else code:>3}  {meaning}")
    return "\n".join(lines) + (f"\n{note}" if note else "")
