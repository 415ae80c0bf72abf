"""Writing a file safely: under a lock, syntax-checked, atomically, keeping its mode."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock

from patcher.errors import BASH_SYNTAX, FILE_PROBLEM, PatchError


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the lock beside ``path`` (``PATH.lock``), across threads and processes."""
    with FileLock(str(path) + ".lock", timeout=120):
        yield


def read_text(path: Path) -> str:
    """The file's text, or a PatchError that says what is wrong with the path."""
    if not path.exists():
        raise PatchError(FILE_PROBLEM, f"{path}: no such file")
    if path.is_dir():
        raise PatchError(FILE_PROBLEM, f"{path}: is a directory, not a file")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise PatchError(FILE_PROBLEM, f"{path}: not valid UTF-8 ({error}); is this the right file?") from None
    except OSError as error:
        raise PatchError(FILE_PROBLEM, f"{path}: cannot read ({error.strerror})") from None


def bash_syntax_error(path: Path) -> str | None:
    """What ``bash -n`` says of ``path``, or None when it is fine or bash is absent."""
    bash = shutil.which("bash")
    if bash is None:
        return None
    check = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, timeout=60)
    if check.returncode == 0:
        return None
    return check.stderr.strip() or "bash -n failed"


def replace(path: Path, text: str, check: Callable[[Path], str | None] | None = None) -> None:
    """Atomically replace ``path`` with ``text``, keeping its permission bits and owner.

    The text goes to a temporary file in the same directory; when ``check`` reports a
    problem with it, nothing is written and PatchError is raised.
    """
    info = path.stat() if path.exists() else None
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temp = Path(temp_name)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        if info is not None:
            os.chmod(temp, stat.S_IMODE(info.st_mode))
            with contextlib.suppress(OSError):
                os.chown(temp, info.st_uid, info.st_gid)
        problem = check(temp) if check else None
        if problem:
            raise PatchError(BASH_SYNTAX, f"the patched {path.name} fails bash -n; nothing written:\n{problem}")
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)
