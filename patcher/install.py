"""``eval-probe install DIR``: the probe as DIR/sitecustomize.py, for lm-eval without InferenceX."""

from __future__ import annotations

from pathlib import Path

from patcher.files import Outcome
from patcher.markers import SITECUSTOMIZE
from patcher.payload import Payload
from patcher.safewrite import locked, read_text, replace


def install(directory: Path, payload: Payload) -> Outcome:
    """Write the probe as ``DIR/sitecustomize.py``, or add it to the one already there.

    Idempotent; a newer body replaces an older block. A file we create ourselves also
    runs the sitecustomize.py it shadows further along sys.path, so installing the probe
    never silently disables someone else's start-up code.
    """
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "sitecustomize.py"
    with locked(target):
        if not target.exists():
            replace(target, payload.standalone)
            return Outcome(0, f"{target}: written; add {directory} to PYTHONPATH to activate the probe")
        text = read_text(target)
        lines = text.splitlines(keepends=True)
        found = SITECUSTOMIZE.find_one(lines)
        if found is None:
            separator = "" if not text or text.endswith("\n") else "\n"
            replace(target, text + separator + payload.appended)
            return Outcome(0, f"{target}: probe appended after the existing start-up code")
        alone = "".join(lines[: found.start] + lines[found.end :]).strip() == ""
        block = payload.standalone if alone else payload.appended
        new = "".join(lines[: found.start]) + block + "".join(lines[found.end :])
        if new == text:
            return Outcome(0, f"{target}: already holds this probe; nothing changed")
        replace(target, new)
        return Outcome(0, f"{target}: probe block upgraded from {found.version}")
