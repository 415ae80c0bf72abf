"""Text surgery on InferenceX's benchmark_lib.sh (pure: text in, text out).

The probe block goes inside ``_patch_lm_eval()``, immediately before the one
``export PYTHONPATH=...`` line that ends it (the anchor). It appends the probe's
sitecustomize text to the file the pipeline has just written, so the probe installs
after, and on top of, the pipeline's own patches. Works on both shapes of the function
in InferenceX's history: the pipeline's Python written by a heredoc, or copied from
``utils/evals/patches``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from patcher.bashscan import Line, scan, split_lines
from patcher.errors import AMBIGUOUS_ANCHOR, DAMAGED_BLOCK, NO_ANCHOR, NO_FUNCTION, UNSURE_SHELL, PatchError
from patcher.markers import PATCH, Block

FUNCTION = "_patch_lm_eval"
DELIMITER = "LM_EVAL_PROBE_BODY"
# A definition: "name() {", "function name {" or "function name() {" (the brace may follow).
_FUNCTION_RE = re.compile(rf"^\s*(?:function\s+{FUNCTION}\s*(?:\(\s*\))?|{FUNCTION}\s*\(\s*\))\s*\{{?\s*$")
_ANCHOR_RE = re.compile(r"^\s*export\s+PYTHONPATH=")
_TARGET_RE = re.compile(r"""("?)\$\{?(\w+)\}?/sitecustomize\.py\1""")


@dataclass(frozen=True)
class Status:
    """What a file holds: no block, or a block of some version and body digest."""

    patched: bool
    version: str | None = None
    digest: str | None = None


def _commands(lines: list[str], shell: list[Line] | None = None) -> list[str]:
    """``lines`` with every line that does not start a shell command blanked, same indices.

    Blanked are here-document bodies, continued lines and the inside of multi-line strings.
    """
    shell = scan("".join(lines)) if shell is None else shell
    return [line if seen.command else "\n" for line, seen in zip(lines, shell, strict=True)]


def _find_block(lines: list[str]) -> Block | None:
    found = PATCH.find_one(_commands(lines))
    if found is not None and lines[found.end - 2] != DELIMITER + "\n":
        raise PatchError(
            DAMAGED_BLOCK, f"the lm-eval-probe block at line {found.start + 1} has no heredoc terminator {DELIMITER!r}"
        )
    return found


def status(text: str) -> Status:
    """Whether ``text`` holds a probe block, and which one."""
    block = _find_block(split_lines(text))
    return Status(False) if block is None else Status(True, block.version, block.digest)


def unpatch(text: str) -> str:
    """``text`` without the probe block: byte for byte what it was before patching."""
    lines = split_lines(text)
    block = _find_block(lines)
    return text if block is None else "".join(lines[: block.start] + lines[block.end :])


def _locate(lines: list[str]) -> tuple[int, str]:
    """The anchor's line index and the sitecustomize.py path expression to append to.

    Only lines that start a shell command count. The path is read from code only: never from a
    comment, a here-document or a single-quoted string, where ``$dir`` is not expanded.
    """
    shell = scan("".join(lines))
    commands = _commands(lines, shell)
    starts = [i for i, line in enumerate(commands) if _FUNCTION_RE.match(line)]
    if not starts:
        raise PatchError(NO_FUNCTION, f"expected a function {FUNCTION}() in the file; found none")
    if len(starts) > 1:
        raise PatchError(
            AMBIGUOUS_ANCHOR,
            f"expected one {FUNCTION}() definition; found {len(starts)} (lines {[s + 1 for s in starts]})",
        )
    start = starts[0]
    end = next((i for i in range(start + 1, len(lines)) if commands[i].rstrip("\n").rstrip() == "}"), None)
    if end is None:
        raise PatchError(NO_FUNCTION, f"{FUNCTION}() at line {start + 1} never closes with '}}' at column 0")
    anchors = [i for i in range(start + 1, end) if _ANCHOR_RE.match(commands[i])]
    if not anchors:
        hidden = [i + 1 for i in range(start + 1, end) if _ANCHOR_RE.match(lines[i])]
        inside = f" (line {hidden} is inside a here-document or a string, not a command)" if hidden else ""
        raise PatchError(
            NO_ANCHOR,
            f"expected one 'export PYTHONPATH=...' command ending {FUNCTION}() (lines {start + 1}-{end + 1}); "
            f"found none{inside}",
        )
    if len(anchors) > 1:
        found = ", ".join(f"line {i + 1}: {lines[i].strip()}" for i in anchors)
        raise PatchError(AMBIGUOUS_ANCHOR, f"expected one 'export PYTHONPATH=...' line in {FUNCTION}(); found {found}")
    targets = {m.group(0) for i in range(start + 1, anchors[0]) for m in _TARGET_RE.finditer(shell[i].code)}
    if len(targets) != 1:
        raise PatchError(
            NO_ANCHOR,
            f"expected {FUNCTION}() to write one sitecustomize.py before line {anchors[0] + 1}; "
            f"found {sorted(targets)}",
        )
    target = targets.pop()
    if not target.startswith('"'):
        target = f'"{target}"'
    return anchors[0], target


def block(body_text: str, version: str, digest: str, indent: str, target: str) -> str:
    """The bash lines that append ``body_text`` to ``target``, framed by markers."""
    if DELIMITER in body_text.splitlines():
        raise PatchError(DAMAGED_BLOCK, f"the probe body contains the heredoc terminator line {DELIMITER!r}; refusing")
    if not body_text.endswith("\n"):
        body_text += "\n"
    return (
        f"{indent}{PATCH.begin_line(version, digest, '(remove with: eval-probe patch --unpatch)')}\n"
        f"{indent}cat >> {target} <<'{DELIMITER}'\n"
        f"{body_text}"
        f"{DELIMITER}\n"
        f"{indent}{PATCH.end_line}\n"
    )


def patch(text: str, body_text: str, version: str, digest: str) -> str:
    """``text`` with the probe block (a newer one replaces an older one)."""
    lines = split_lines(unpatch(text))
    anchor, target = _locate(lines)
    indent = lines[anchor][: len(lines[anchor]) - len(lines[anchor].lstrip())]
    patched = "".join(lines[:anchor]) + block(body_text, version, digest, indent, target) + "".join(lines[anchor:])
    # Read the result back the way bash will: the block must stand as commands of its own,
    # right before the anchor, whatever the text around it does.
    commands = _commands(split_lines(patched))
    found = PATCH.find_one(commands)
    if found is None or found.start != anchor or not _ANCHOR_RE.match(commands[found.end]):
        raise PatchError(UNSURE_SHELL, f"the block would not stand as its own command before line {anchor + 1}")
    return patched
