"""The runtime's one voice: lines on stderr, each error reported once.

No logging configuration can be assumed inside someone else's process, so the runtime
writes its own lines, all with the one prefix ``[lm-eval-probe]``.
"""

from __future__ import annotations

import sys
import threading

PREFIX = "[lm-eval-probe]"


def one_line(text: str) -> str:
    """``text`` as one printable line: what does not print (a newline, an escape sequence from a
    path) is written as its escape, so no line can pass for another."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def say(message: str) -> None:
    """Write one line on stderr; never raises."""
    try:
        sys.stderr.write(f"{PREFIX} {one_line(message)}\n")
        sys.stderr.flush()
    except Exception:
        pass


# What say_once said in this process: a bad knob, or an untested release, is one mistake,
# however many integrations and evaluations meet it.
_SAID: set[str] = set()


def say_once(message: str | None) -> None:
    """Say ``message`` unless this process said it already (or it is None)."""
    if message and message not in _SAID:
        _SAID.add(message)
        say(message)


def forget_said() -> None:
    _SAID.clear()


class ErrorReports:
    """Reports each kind of internal error once: the host process is never flooded."""

    def __init__(self) -> None:
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def report(self, where: str, error: BaseException) -> None:
        key = f"{where}:{type(error).__name__}"
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        say(f"internal error in {where}: {error!r}; lm-eval carries on unprobed there")

    def once(self, key: str, message: str) -> None:
        """Say ``message`` the first time ``key`` is seen."""
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
        say(message)
