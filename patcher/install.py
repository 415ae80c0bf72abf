"""``eval-probe install DIR``: the probe as DIR/sitecustomize.py, for lm-eval without InferenceX."""

from __future__ import annotations

from pathlib import Path

from patcher.errors import FILE_PROBLEM, PatchError
from patcher.files import Outcome
from patcher.markers import SITECUSTOMIZE
from patcher.payload import Payload
from patcher.safewrite import locked, read_text, replace, target


def install(directory: Path, payload: Payload) -> Outcome:
    """Write the probe as ``DIR/sitecustomize.py``, or add it to the one already there.

    Idempotent; a newer body replaces an older block. A file we create ourselves also
    runs the sitecustomize.py it shadows further along sys.path, so installing the probe
    never silently disables someone else's start-up code.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PatchError(FILE_PROBLEM, f"{directory}: cannot create the directory ({error.strerror})") from None
    site = directory / "sitecustomize.py"
    real = target(site, must_exist=False)  # a symlinked sitecustomize.py is changed at its target
    with locked(real):
        if not real.exists():
            replace(real, payload.standalone)
            return Outcome(0, f"{site}: written; add {directory} to PYTHONPATH to activate the probe")
        text = read_text(real)
        lines = text.splitlines(keepends=True)
        found = SITECUSTOMIZE.find_one(lines)
        if found is None:
            separator = "" if not text or text.endswith("\n") else "\n"
            replace(real, text + separator + payload.appended)
            return Outcome(0, f"{site}: probe appended after the existing start-up code")
        alone = "".join(lines[: found.start] + lines[found.end :]).strip() == ""
        block = payload.standalone if alone else payload.appended
        new = "".join(lines[: found.start]) + block + "".join(lines[found.end :])
        if new == text:
            return Outcome(0, f"{site}: already holds this probe; nothing changed")
        replace(real, new)
        return Outcome(0, f"{site}: probe block upgraded from {found.version}")
