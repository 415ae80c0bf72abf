"""The processes a command started: signal its process group, see who still runs, outlive them.

``eval-probe run`` starts its command as the leader of a new session, so everything the command
starts (``bash -c "python -m lm_eval ..."``: bash, then lm-eval) shares its process group, unless
a process leaves it on purpose (``setsid``). Such a process is out of reach of the group's
signals, but it still carries the environment the command was given: where /proc shows it, a
``marker`` in that environment (the probe's own directory) finds it, and from then on its own
process group is watched as the command's is.

Listing /proc is not atomic: a process that starts another and ends while the list is read
can be missed. Whether a process group still has a member is exact (``killpg(group, 0)``), so
a watched group counts as running while that says so, named or not.

Run as a script (``python -I processgroup.py GROUP PATH [MARKER [GROUP,...]]``), it removes PATH
once nothing of GROUP (and of the other groups given), and nothing carrying MARKER, is left.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

# How often the detached remover looks again.
_REMOVER_POLL_S = 0.5
# How long after finding nothing we look once more before believing it: a process in the middle of
# exec shows no environment (so no marker) for an instant, and a setsid one is then missed.
_SECOND_LOOK_S = 0.2
# How many looks at /proc, at most, for a group that exists but showed no live member.
_LOOKS = 3


def signal_group(group: int, number: int) -> None:
    """Send signal ``number`` to every process of ``group``, then SIGCONT, as a shell's ``kill`` does
    for a job: a stopped process acts on a signal only once continued, and would otherwise keep
    us waiting on it for ever (but after SIGSTOP, which is meant to stop it). Nothing when none is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, number)
        if number not in (signal.SIGCONT, signal.SIGSTOP):
            os.killpg(group, signal.SIGCONT)


def group_exists(group: int) -> bool:
    """Whether ``group`` has a member, a zombie included (exact: the kernel's answer)."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone's: it exists
    return True


def members(group: int, marker: str | None = None, followed: set[int] | None = None) -> list[str]:
    """``"PID COMMAND"`` for each live process of ``group`` (zombies are not running) and, with
    ``marker``, each other live process whose environment holds it, with `` (outside its process
    group)`` added. ``followed``: more groups counted as ``group`` is; the group of each marked
    process found outside them is added to it. A watched group that still exists while /proc
    showed no live member of it is looked at again: it runs nothing only once two looks in a row
    show it the same zombies; else a member started while the list was read, and the group is
    one entry that says so (as is ``group`` where /proc cannot list its members)."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return [f"process group {group} (its members cannot be listed here)"] if group_exists(group) else []
    watched = {group} | (followed or set())
    needle = None if marker is None else marker.encode()
    before: dict[int, set[int]] = {}
    for _ in range(_LOOKS):
        found, live, zombies = _scan(proc, watched, needle)
        # Running unseen: it exists, yet showed no live member, nor the zombies it showed last look.
        unseen = sorted(g for g in watched - live if group_exists(g) and zombies.get(g) != before.get(g, -1))
        if not unseen:
            break
        before = zombies
    for _pid, _command, pgrp, inside in found:
        if not inside and followed is not None:
            followed.add(pgrp)
    named = [f"{pid} {command}{_outside(pgrp, group)}" for pid, command, pgrp, _ in found]
    return named + [
        f"process group {g} (members that start and end while /proc is read){_outside(g, group)}" for g in unseen
    ]


def _outside(pgrp: int, group: int) -> str:
    return "" if pgrp == group else " (outside its process group)"


Found = list[tuple[int, str, int, bool]]  # (pid, command, process group, inside the watched groups)


def _scan(proc: Path, watched: set[int], needle: bytes | None) -> tuple[Found, set[int], dict[int, set[int]]]:
    """One look at /proc: (pid, command, group, inside) of each live process of the ``watched``
    groups or carrying ``needle``, in pid order; the watched groups with a live member; the
    zombies shown of each watched group."""
    found: Found = []
    live: set[int] = set()
    zombies: dict[int, set[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            state, _ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            inside = int(pgrp) in watched
            if state == "Z":
                if inside:
                    zombies.setdefault(int(pgrp), set()).add(int(entry.name))
                continue
            if not inside and (needle is None or needle not in (entry / "environ").read_bytes()):
                continue
            words = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # it ended while we looked, or is not ours to read
        if inside:
            live.add(int(pgrp))
        found.append((int(entry.name), _short(" ".join(w.decode(errors="replace") for w in words)), int(pgrp), inside))
    found.sort()
    return found, live, zombies


def settled_members(group: int, marker: str | None = None, followed: set[int] | None = None) -> list[str]:
    """``members(group, marker, followed)``, where an empty answer counts only once a second look, a
    moment later, agrees with it."""
    left = members(group, marker, followed)
    if not left:
        time.sleep(_SECOND_LOOK_S)
        left = members(group, marker, followed)
    return left


def wait_until_empty(
    group: int, seconds: float, marker: str | None = None, followed: set[int] | None = None
) -> list[str]:
    """Wait up to ``seconds`` for ``settled_members(group, marker, followed)`` to be empty; the
    members left then."""
    deadline = time.monotonic() + seconds
    while (left := settled_members(group, marker, followed)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def remove_when_empty(group: int, path: Path, marker: str | None = None, followed: set[int] | None = None) -> None:
    """Have a detached process remove ``path`` once ``settled_members(group, marker, followed)`` is
    empty, so that those still running keep what they need there; this process need not stay."""
    extra = [] if marker is None else [marker, ",".join(str(g) for g in sorted(followed or ()))]
    subprocess.Popen(
        [sys.executable, "-I", __file__, str(group), str(path), *extra],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )  # fmt: skip


def _short(command: str, limit: int = 100) -> str:
    command = " ".join(command.split())  # one line, whatever the arguments hold
    return command if len(command) <= limit else command[: limit - 3] + "..."


def _remove_when_empty(group: int, path: str, marker: str | None, followed: set[int]) -> None:
    while settled_members(group, marker, followed):
        time.sleep(_REMOVER_POLL_S)
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    groups = sys.argv[4].split(",") if len(sys.argv) > 4 else []
    _remove_when_empty(
        int(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None, {int(g) for g in groups if g}
    )
