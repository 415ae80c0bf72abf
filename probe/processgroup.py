"""The processes a command started: signal its process group, see who still runs, outlive them.

``eval-probe run`` starts its command as the leader of a new session, so what it starts shares its
process group. A process that leaves the group (``setsid``) still carries the command's environment.
A ``marker`` there finds it through /proc, and its group is watched too. Run as a script, this
module removes a path once all of them have ended. See docs/cli.md.
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
    """Send signal ``number`` to every process of ``group``, then SIGCONT, as a shell's ``kill``
    does.

    A stopped process acts on a signal only once continued; SIGSTOP itself is not followed by
    SIGCONT. Does nothing when no process is left.
    """
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
    """``"PID COMMAND"`` for each live process of ``group`` and of the ``followed`` groups.

    Zombies are not running. With ``marker``, each other live process whose environment holds it is
    added, marked as outside its group. Its group joins ``followed``. A group that exists but shows
    no live member is one entry that says so. It runs nothing only once two looks in a row show it
    the same zombies. See docs/cli.md.
    """
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
    """One look at /proc for the ``watched`` groups and the processes carrying ``needle``.

    Returns (pid, command, group, inside) of each live one, in pid order. It also returns the
    watched groups with a live member, and the zombies shown of each.
    """
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
    """Have a detached process remove ``path`` once ``settled_members`` is empty.

    Those still running keep what they need there. This process need not stay.
    """
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
