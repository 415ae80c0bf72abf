"""The marker lines that frame a probe block in someone else's file: one format, one parser.

Both blocks the project writes use it: the InferenceX block in ``benchmark_lib.sh``
(``lm-eval-probe patch``) and the block in a ``sitecustomize.py`` (``lm-eval-probe
sitecustomize``). A begin line names the version and a digest of the payload; the end line
closes it. One rule everywhere: a file holds at most one block of a kind, and a begin
without its end (or an end without a begin) is a damaged block.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from patcher.errors import DAMAGED_BLOCK, PatchError


@dataclass(frozen=True)
class Block:
    """Where a block sits in a list of lines, and what it says of itself."""

    start: int  # index of its begin line
    end: int  # index one past its end line
    version: str
    digest: str


@dataclass(frozen=True)
class Markers:
    """The begin and end lines of one kind of block (``kind``, e.g. "patch")."""

    kind: str

    @property
    def end_line(self) -> str:
        return f"# <<< lm-eval-probe {self.kind} <<<"

    def begin_line(self, version: str, digest: str, note: str = "") -> str:
        return f"# >>> lm-eval-probe {self.kind} v{version} body={digest}{f' {note}' if note else ''} >>>"

    def _begin(self) -> re.Pattern[str]:
        return re.compile(
            rf"^\s*# >>> lm-eval-probe {re.escape(self.kind)} v(?P<version>\S+) body=(?P<digest>[0-9a-f]+)[ >]"
        )

    def find_all(self, lines: list[str]) -> list[Block]:
        """Every complete block in ``lines``; PatchError(DAMAGED_BLOCK) for a broken frame."""
        begin, blocks = self._begin(), []
        opened: tuple[int, re.Match[str]] | None = None
        for index, line in enumerate(lines):
            match = begin.match(line)
            if match:
                if opened is not None:
                    raise PatchError(DAMAGED_BLOCK, f"the lm-eval-probe {self.kind} block at line {opened[0] + 1} "
                                     f"has no end marker before the next one at line {index + 1}")  # fmt: skip
                opened = (index, match)
            elif line.strip() == self.end_line:
                if opened is None:
                    raise PatchError(DAMAGED_BLOCK, f"an lm-eval-probe {self.kind} end marker at line {index + 1} "
                                     "has no begin marker")  # fmt: skip
                blocks.append(Block(opened[0], index + 1, opened[1]["version"], opened[1]["digest"]))
                opened = None
        if opened is not None:
            raise PatchError(DAMAGED_BLOCK, f"the lm-eval-probe {self.kind} block at line {opened[0] + 1} has no "
                             f"end marker {self.end_line!r}")  # fmt: skip
        return blocks

    def find_one(self, lines: list[str]) -> Block | None:
        """The file's block, None when it has none; PatchError(DAMAGED_BLOCK) for more than one."""
        blocks = self.find_all(lines)
        if len(blocks) > 1:
            starts = [b.start + 1 for b in blocks]
            raise PatchError(DAMAGED_BLOCK, f"found {len(blocks)} lm-eval-probe {self.kind} blocks (lines {starts}); "
                             "expected at most one: remove the extra ones by hand")  # fmt: skip
        return blocks[0] if blocks else None


PATCH = Markers("patch")
SITECUSTOMIZE = Markers("sitecustomize")
