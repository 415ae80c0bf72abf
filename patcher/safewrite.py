"""Writing someone else's file safely: locked, syntax-checked, atomically, keeping its mode and
owner.

Nothing here follows a link it was not asked to follow. Nothing is written outside the directory of
the file being changed. A symlinked file is changed at its target, and the link stays a link. The
temporary file is created exclusively, under an unpredictable name, beside that target. The lock is
taken on that directory itself, so no lock file can be planted or left behind. See docs/cli.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from patcher.errors import BASH_SYNTAX, FILE_PROBLEM, PatchError

LOCK_TIMEOUT_S = 120.0


def target(path: Path, must_exist: bool = True) -> Path:
    """The file that ``path`` names: ``path`` itself, or the end of its chain of symlinks.

    PatchError(FILE_PROBLEM) for a dangling or looping link, or a missing file when
    ``must_exist``.
    """
    if path.is_symlink():
        try:
            return Path(os.path.realpath(path, strict=True))
        except FileNotFoundError:
            raise PatchError(FILE_PROBLEM, f"{path}: no such file (a symlink to {os.readlink(path)})") from None
        except OSError as error:
            raise PatchError(FILE_PROBLEM, f"{path}: cannot follow the symlink ({error.strerror})") from None
    if must_exist and not path.exists():
        raise PatchError(FILE_PROBLEM, f"{path}: no such file")
    return Path(os.path.realpath(path))


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on the directory that holds ``path``, across threads and processes.

    ``flock`` on the directory itself: no lock file is created, so none is left behind and a
    symlink planted at ``PATH.lock`` is never followed. Closing the descriptor releases it.
    """
    directory = path.parent
    try:
        handle = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise PatchError(FILE_PROBLEM, f"{directory}: cannot open it to lock it ({error.strerror})") from None
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise PatchError(
                        FILE_PROBLEM, f"{directory}: another eval-probe held its lock for {LOCK_TIMEOUT_S:.0f} s"
                    ) from None
                time.sleep(0.02)
            except OSError as error:
                raise PatchError(FILE_PROBLEM, f"{directory}: cannot lock the directory ({error.strerror})") from None
        yield
    finally:
        os.close(handle)


def read_text(path: Path) -> str:
    """The text of the regular file ``path``, or a PatchError that says what is wrong with it.

    Never blocks on a FIFO and never reads a device: only regular files are read.
    """
    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise PatchError(FILE_PROBLEM, f"{path}: no such file") from None
    except OSError as error:
        raise PatchError(FILE_PROBLEM, f"{path}: cannot read ({error.strerror})") from None
    try:
        mode = os.fstat(handle).st_mode
        if stat.S_ISDIR(mode):
            raise PatchError(FILE_PROBLEM, f"{path}: is a directory, not a file")
        if not stat.S_ISREG(mode):
            raise PatchError(FILE_PROBLEM, f"{path}: not a regular file (a FIFO, a device or a socket)")
        with os.fdopen(handle, "rb", closefd=False) as file:
            data = file.read()
    except OSError as error:
        raise PatchError(FILE_PROBLEM, f"{path}: cannot read ({error.strerror})") from None
    finally:
        os.close(handle)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise PatchError(FILE_PROBLEM, f"{path}: not valid UTF-8 ({error}); is this the right file?") from None


def bash_syntax_error(path: Path) -> str | None:
    """What ``bash -n`` says of ``path``, or None when it is fine or bash is absent."""
    bash = shutil.which("bash")
    if bash is None:
        return None
    check = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, timeout=60)
    if check.returncode == 0:
        return None
    return check.stderr.strip() or "bash -n failed"


def _keep_owner_and_mode(handle: int, path: Path, info: os.stat_result) -> None:
    """Give the open temporary file ``path``'s owner, group and permission bits, or refuse."""
    mine = os.fstat(handle)
    if (mine.st_uid, mine.st_gid) != (info.st_uid, info.st_gid):
        try:
            os.fchown(handle, info.st_uid, info.st_gid)
        except OSError as error:
            raise PatchError(
                FILE_PROBLEM,
                f"{path}: cannot keep its owner {info.st_uid}:{info.st_gid} ({error.strerror}); "
                "run as its owner or as root",
            ) from None
    os.fchmod(handle, stat.S_IMODE(info.st_mode))  # after fchown, which may clear set-id bits


def _umask() -> int:
    """This process's umask, read without changing it where Linux shows it.

    ``os.umask`` can only set it, and setting it for a moment would race with other threads.
    """
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text(encoding="ascii", errors="replace").splitlines()
        return int(next(line for line in status if line.startswith("Umask:")).split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The permission bits a file created the ordinary way (``open(path, "w")``) gets here."""
    return 0o666 & ~_umask()


def replace(path: Path, text: str, check: Callable[[Path], str | None] | None = None) -> None:
    """Atomically replace the file ``path`` with ``text``, keeping its permission bits and owner.

    ``path`` is not a symlink: see ``target``. When the bits or owner cannot be kept, nothing is
    written. A new file gets an ordinary new file's bits (``new_file_mode``), never the temporary
    file's 0600. Others, such as lm-eval run as another user, must be able to read it. When
    ``check`` reports a problem, nothing is written and PatchError is raised.
    """
    try:
        info: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        info = None
    try:
        handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise PatchError(FILE_PROBLEM, f"{path}: cannot write in {path.parent} ({error.strerror})") from None
    done = False
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
            if info is not None:
                _keep_owner_and_mode(out.fileno(), path, info)
            else:
                os.fchmod(out.fileno(), new_file_mode())
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        problem = check(Path(temp_name)) if check else None
        if problem:
            raise PatchError(BASH_SYNTAX, f"the patched {path.name} fails bash -n; nothing written:\n{problem}")
        os.replace(temp_name, path)
        done = True
    except OSError as error:
        raise PatchError(FILE_PROBLEM, f"{path}: cannot write ({error.strerror})") from None
    finally:
        if not done:  # once renamed, that name may already be someone else's file: leave it
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp_name)
