"""Builds the text injected into a sitecustomize.py from the probe's own source files.

One source of truth: the text is made from ``probe/bootstrap.py`` and ``probe/body.py``
every time it is needed, never kept as a second copy. Both run in namespaces of their
own, so nothing they define can clobber, or be clobbered by, the host file's names.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from probe.body import PROBE_VERSION

_HERE = Path(__file__).resolve().parent
BEGIN = "# >>> lm-eval-probe sitecustomize"
END = "# <<< lm-eval-probe sitecustomize <<<"
_BEGIN_RE = re.compile(rf"^{re.escape(BEGIN)} v(?P<version>\S+) body=(?P<digest>[0-9a-f]+) >>>$")


class InjectionError(ValueError):
    """The probe's source cannot be embedded safely (it would end the literal early)."""


@dataclass(frozen=True)
class Block:
    """Where an injected block sits in a text, and what it says of itself."""

    start: int  # index of its first line
    end: int  # index one past its last line
    version: str
    digest: str


@functools.cache  # the sources do not change while a process runs; read each once
def _source(name: str) -> str:
    return (_HERE / name).read_text(encoding="utf-8")


def _literal(source: str, name: str) -> str:
    # A raw triple-quoted literal keeps the source readable in the target file; it only
    # breaks on a triple single quote or a trailing backslash, which we refuse.
    if "'''" in source or source.rstrip("\n").endswith("\\"):
        raise InjectionError(f"{name} cannot be embedded: it contains ''' or ends in a backslash")
    return "r'''" + source + "'''"


def body_digest() -> str:
    """A short hash of what gets injected: changes whenever the body or the stub does."""
    text = "\0".join(_source(name) for name in ("bootstrap.py", "body.py", "chain.py"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sitecustomize_text(chain: bool = False) -> str:
    """The exact block injected into a sitecustomize.py, markers included.

    ``chain=True`` is for a sitecustomize.py the probe creates itself (``install`` into an
    empty directory, ``run``): it then also runs the sitecustomize.py it shadows.
    """
    bootstrap = _literal(_source("bootstrap.py"), "bootstrap.py")
    body = _literal(_source("body.py"), "body.py")
    chained = _literal(_source("chain.py"), "chain.py") if chain else '""'
    return (
        f"{BEGIN} v{PROBE_VERSION} body={body_digest()} >>>\n"
        "# Installed by lm-eval-probe: ends max-token non-termination inside lm-eval.\n"
        "# Disable with HYPERLOOM_EVAL_PROBE=0. Source: probe/bootstrap.py, probe/body.py.\n"
        "def _lm_eval_probe_start(origin):\n"
        f"    bootstrap = {bootstrap}\n"
        f"    body = {body}\n"
        f"    chain = {chained}\n"
        '    namespace = {"__name__": "_hyperloom_eval_probe_boot"}\n'
        '    exec(compile(bootstrap, f"{origin} (lm-eval-probe bootstrap)", "exec"), namespace)\n'
        '    namespace["boot"](body, origin, chain)\n'
        "\n"
        "\n"
        "try:\n"
        '    _lm_eval_probe_start(globals().get("__file__") or "sitecustomize.py")\n'
        "except Exception as _lm_eval_probe_error:\n"
        "    import sys as _lm_eval_probe_sys\n"
        '    _lm_eval_probe_sys.stderr.write(f"[lm-eval-probe] start-up failed: {_lm_eval_probe_error!r}\\n")\n'
        "del _lm_eval_probe_start\n"
        f"{END}\n"
    )


def find_blocks(lines: list[str]) -> list[Block]:
    """Every injected block in ``lines`` (each line with its newline)."""
    blocks = []
    start: tuple[int, re.Match[str]] | None = None
    for index, line in enumerate(lines):
        match = _BEGIN_RE.match(line.rstrip("\n"))
        if match:
            start = (index, match)
        elif line.rstrip("\n") == END and start is not None:
            begin, found = start
            blocks.append(Block(begin, index + 1, found["version"], found["digest"]))
            start = None
    return blocks
