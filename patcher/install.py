"""``eval-probe install DIR``: the probe as DIR/sitecustomize.py, for lm-eval without InferenceX."""

from __future__ import annotations

from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    ExtensionFileLoader,
    FileFinder,
    SourceFileLoader,
    SourcelessFileLoader,
)
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
    never silently disables someone else's start-up code. ``DIR`` itself is created when
    its parent exists (a mistyped parent is a PatchError, not a new tree); what Python
    would import as ``sitecustomize`` from ``DIR`` instead of the file (a package, an
    extension module) is refused before anything is written.
    """
    created = _make_directory(directory)
    site = directory / "sitecustomize.py"
    shadow = _shadowing(directory)
    if shadow is not None:
        raise PatchError(
            FILE_PROBLEM,
            f"{shadow}: Python imports this as sitecustomize from {directory}, before any sitecustomize.py, "
            "so the probe would never load; remove or rename it, or install into another directory",
        )
    real = target(site, must_exist=False)  # a symlinked sitecustomize.py is changed at its target
    with locked(real):
        if not real.exists():
            replace(real, payload.standalone)
            made = f"{directory} created, " if created else ""
            return Outcome(0, f"{site}: {made}written; add {directory} to PYTHONPATH to activate the probe")
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


# sitecustomize.cpython-312-x86_64-linux-gnu.so and the like: what any CPython imports as sitecustomize.
_OTHER_PYTHONS_EXTENSION = "sitecustomize.cpython-*.so"


def _make_directory(directory: Path) -> bool:
    """Make ``directory`` unless it exists; True when it was made. Its parent must exist."""
    if directory.is_dir():
        return False
    if directory.exists() or directory.is_symlink():
        raise PatchError(FILE_PROBLEM, f"{directory}: not a directory")
    if not directory.parent.is_dir():
        raise PatchError(FILE_PROBLEM, f"{directory.parent}: no such directory (create it first, or check the path)")
    try:
        directory.mkdir()
    except OSError as error:
        raise PatchError(FILE_PROBLEM, f"{directory}: cannot create the directory ({error.strerror})") from None
    return True


def _shadowing(directory: Path) -> Path | None:
    """What Python would import as ``sitecustomize`` from ``directory`` instead of
    ``sitecustomize.py``.

    That is a regular package or an extension module; None when the file would be imported. It asks
    a fresh FileFinder, the one Python uses for a path entry. Its order is package, extension
    modules, source, bytecode.
    """
    loaders = (
        (ExtensionFileLoader, EXTENSION_SUFFIXES),
        (SourceFileLoader, SOURCE_SUFFIXES),
        (SourcelessFileLoader, BYTECODE_SUFFIXES),
    )
    spec = FileFinder(str(directory), *loaders).find_spec("sitecustomize")
    if spec is not None and spec.origin is not None:  # else nothing, or a namespace portion, which a module beats
        is_package = spec.submodule_search_locations is not None
        if is_package or isinstance(spec.loader, ExtensionFileLoader):
            return Path(spec.origin).parent if is_package else Path(spec.origin)
    # An extension module built for another CPython (the one lm-eval runs on may not be this one).
    return next((p for p in sorted(directory.glob(_OTHER_PYTHONS_EXTENSION)) if p.is_file()), None)
