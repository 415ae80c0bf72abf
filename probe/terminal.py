"""Prose for a person at a terminal: long lines wrapped to its width, nothing changed elsewhere."""

from __future__ import annotations

import shutil
import sys
import textwrap
from typing import TextIO

# A narrower width (a tiny window, or COLUMNS=1) would put every word on a line of its own.
_NARROWEST = 20


def wrap(text: str, width: int) -> str:
    """``text`` with every line longer than ``width`` (20 at least) wrapped at spaces.

    A continuation is indented two spaces more than its line. Words are never broken. Only
    whitespace at the breaks changes. Short lines are kept as they are.
    """
    out: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip(" "))]
        out += textwrap.wrap(
            line,
            max(width, _NARROWEST),
            subsequent_indent=indent + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
    return "\n".join(out)


def fit(text: str, stream: TextIO | None = None) -> str:
    """``text`` wrapped to the terminal's width (``COLUMNS`` first) when ``stream`` is a terminal.

    ``stream`` is stdout by default. Otherwise ``text`` is unchanged, so a pipe or a log keeps one
    item a line.
    """
    stream = sys.stdout if stream is None else stream
    if not stream.isatty():
        return text
    return wrap(text, shutil.get_terminal_size().columns)
