"""The processes of one process group: signal them all, see who still runs, outlive them.

``eval-probe run`` starts its command as the leader of a new session, so everything the command
starts (``bash -c "python -m lm_eval ..."``: bash, then lm-eval) shares its process group, unless
a process leaves it on purpose (``setsid``); such a process is out of reach here.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

# Run by a detached interpreter: removes a directory once no process of the group is left.
_REMOVER = """
import os, shutil, sys, time
group, path = int(sys.argv[1]), sys.argv[2]
while True:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        break
    except PermissionError:
        pass
    time.sleep(0.5)
shutil.rmtree(path, ignore_errors=True)
"""


def signal_group(group: int, number: int) -> None:
    """Send signal ``number`` to every process of ``group``; nothing when none is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, number)


def members(group: int) -> list[str]:
    """``"PID COMMAND"`` for each live process of ``group`` (zombies are not running); where
    /proc cannot list them, one entry that says the group still exists, or none."""
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
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
            state, _ppid, pgrp = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            if int(pgrp) != group or state == "Z":
                continue
            words = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except (OSError, ValueError, IndexError):
            continue  # it ended while we looked, or is not ours to read
        command = " ".join(w.decode(errors="replace") for w in words)
        found.append(f"{entry.name} {_short(command)}")
    return sorted(found, key=lambda member: int(member.split()[0]))


def wait_until_empty(group: int, seconds: float) -> list[str]:
    """Wait up to ``seconds`` for ``group`` to have no live process; the members left then."""
    deadline = time.monotonic() + seconds
    while (left := members(group)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def remove_when_empty(group: int, path: Path) -> None:
    """Have a detached process remove ``path`` once no process of ``group`` is left, so that
    those still running keep what they need there; this process need not stay."""
    subprocess.Popen(
        [sys.executable, "-I", "-c", _REMOVER, str(group), str(path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True,
    )  # fmt: skip


def _short(command: str, limit: int = 100) -> str:
    command = " ".join(command.split())  # one line, whatever the arguments hold
    return command if len(command) <= limit else command[: limit - 3] + "..."
