"""Opening what a result directory holds without trusting it (file-system glue).

Only regular files are opened: a FIFO would block. Nothing is reached through a link leading outside
the result directory. No file is read past a bound the caller gives. See docs/reading.md.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from probe.reader.documents import Unreadable

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)
# O_NONBLOCK: should a FIFO be swapped in after the check, opening it must not wait for a
# writer. O_NOFOLLOW: nor may the last component have become a link. (0 where absent.)
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def resolve_inside(root: Path, path: Path) -> Path:
    """``path`` with every link resolved, when that lies inside ``root``.

    Else :class:`Unreadable`: a dangling or looping link, or one leading outside ``root``.
    """
    real_root = Path(os.path.realpath(root))
    try:
        real = Path(os.path.realpath(path, strict=True))
    except OSError as error:
        raise Unreadable(f"cannot be resolved ({error.strerror or error})") from None
    if real != real_root and real_root not in real.parents:
        raise Unreadable(f"leads outside the result directory (to {real})")
    return real


def list_directory(path: Path) -> list[os.DirEntry[str]]:
    """The entries of directory ``path``, sorted by name.

    :class:`Unreadable` when it cannot be listed, so that its contents are never skipped silently.
    """
    try:
        with os.scandir(path) as entries:
            return sorted(entries, key=lambda entry: entry.name)
    except OSError as error:
        raise Unreadable(f"cannot be listed ({error.strerror or error})") from None


def read_regular_file(root: Path, path: Path, limit: int) -> bytes:
    """The bytes of ``path``, a regular file inside ``root`` of at most ``limit`` bytes.

    Anything else raises :class:`Unreadable` with the reason, without reading past ``limit``
    and without opening special files.
    """
    real = resolve_inside(root, path)
    try:
        _check_regular(os.stat(real), limit)
        descriptor = os.open(real, _OPEN_FLAGS)
    except OSError as error:
        raise Unreadable(error.strerror or str(error)) from None
    with os.fdopen(descriptor, "rb") as handle:
        # Checked again on what was opened: the path may have been replaced since.
        _check_regular(os.fstat(descriptor), limit)
        try:
            data = handle.read(limit + 1)
        except OSError as error:
            raise Unreadable(error.strerror or str(error)) from None
    if len(data) > limit:
        raise Unreadable(f"larger than the {limit} bytes the reader accepts (it grew while being read)")
    return data


def _check_regular(info: os.stat_result, limit: int) -> None:
    for is_kind, kind in _KINDS:
        if is_kind(info.st_mode):
            raise Unreadable(f"not a regular file ({kind})")
    if not stat.S_ISREG(info.st_mode):
        raise Unreadable("not a regular file")
    if info.st_size > limit:
        raise Unreadable(f"{info.st_size} bytes, larger than the {limit} bytes the reader accepts")
