"""The patcher's failures, each with its own exit code and a message that says what to do."""

from __future__ import annotations

# Exit codes of `eval-probe patch` / `install` (documented in the README).
NOT_CURRENT = 1  # `--check` only
FILE_PROBLEM = 3
NO_FUNCTION = 4
NO_ANCHOR = 5
AMBIGUOUS_ANCHOR = 6
BASH_SYNTAX = 7
DAMAGED_BLOCK = 8
UNSURE_SHELL = 9  # shell syntax around the anchor that the patcher does not follow


class PatchError(Exception):
    """A file the patcher refuses to change; nothing has been written."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
