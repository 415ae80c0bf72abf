"""The processes a command started: signal its process group, see who still runs, outlive them.

``eval-probe run`` starts its command as the leader of a new session, so everything the command
starts (``bash -c "python -m lm_eval ..."``: bash, then lm-eval) shares its process group, unless
a process leaves it on purpose (``setsid``). Such a process is out of reach of the group's
signals, but it still carries the environment the command was given: where /proc shows it, a
``marker`` in that environment (the probe's own directory) finds it.

Run as a script (``python -I processgroup.py GROUP PATH [MARKER]``), it removes PATH once nothing
of GROUP, and nothing carrying MARKER, is left.
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


def signal_group(group: int, number: int) -> None:
    """Send signal ``number`` to every process of ``group``, then SIGCONT, as a shell's ``kill`` does
    for a job: a stopped process acts on a signal only once continued, and would otherwise keep
    us waiting on it for ever. Nothing when none is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, number)
        if number != signal.SIGCONT:
            os.killpg(group, signal.SIGCONT)


def members(group: int, marker: str | None = None) -> list[str]:
    """``"PID COMMAND"`` for each live process of ``group`` (zombies are not running) and, with
    ``marker``, each other live process whose environment holds it, with `` (outside its process
    group)`` added; where /proc cannot list them, one entry that says the group still exists, or none."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [f"process group {group} (its members cannot be listed here)"]
    found = []
    needle = None if marker is None else marker.encode()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            state, _ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            if state == "Z":
                continue
            inside = int(pgrp) == group
            if not inside and (needle is None or needle not in (entry / "environ").read_bytes()):
                continue
            words = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # it ended while we looked, or is not ours to read
        command = " ".join(w.decode(errors="replace") for w in words)
        found.append(f"{entry.name} {_short(command)}" + ("" if inside else " (outside its process group)"))
    return sorted(found, key=lambda member: int(member.split()[0]))


def settled_members(group: int, marker: str | None = None) -> list[str]:
    """``members(group, marker)``, where an empty answer counts only once a second look, a moment
    later, agrees with it."""
    left = members(group, marker)
    if not left:
        time.sleep(_SECOND_LOOK_S)
        left = members(group, marker)
    return left


def wait_until_empty(group: int, seconds: float, marker: str | None = None) -> list[str]:
    """Wait up to ``seconds`` for ``settled_members(group, marker)`` to be empty; the members left then."""
    deadline = time.monotonic() + seconds
    while (left := settled_members(group, marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def remove_when_empty(group: int, path: Path, marker: str | None = None) -> None:
    """Have a detached process remove ``path`` once ``settled_members(group, marker)`` is empty, so that
    those still running keep what they need there; this process need not stay."""
    subprocess.Popen(
        [sys.executable, "-I", __file__, str(group), str(path), *([] if marker is None else [marker])],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )  # fmt: skip


def _short(command: str, limit: int = 100) -> str:
    command = " ".join(command.split())  # one line, whatever the arguments hold
    return command if len(command) <= limit else command[: limit - 3] + "..."


def _remove_when_empty(group: int, path: str, marker: str | None) -> None:
    while settled_members(group, marker):
        time.sleep(_REMOVER_POLL_S)
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    _remove_when_empty(int(sys.argv[1]), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
