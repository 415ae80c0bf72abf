"""Builds the text injected into a sitecustomize.py from the runtime's own source files.

One source of truth: the text is made from the files in ``probe/runtime/`` every time it is
needed, never kept as a second copy. The start-up stub (``bootstrap.py``) runs in a
namespace of its own, and the other modules become the private package
``_hyperloom_eval_probe``: their imports of one another (``probe.runtime.X``) are renamed
to it, so they never depend on ``probe`` being importable where they run.

Every Python process that has the file compiles it from source at start-up, lm-eval or not,
so the modules travel packed (JSON, zlib, base85: about a third of their size, and one
string token): the stub and the chain stay readable, and ``eval-probe body --sources``
prints the modules as they run.

The chain (``runtime/hooking/chain.py``) goes only into a sitecustomize.py the probe creates itself
(``eval-probe install`` into an empty directory, ``eval-probe run``): only one
``sitecustomize`` is ever imported, so a directory put first on PYTHONPATH would otherwise
disable the user's or the distribution's start-up code. Such a file says so on its second
line (``chain.MADE_BY_PROBE``), and the chain skips every file that holds nothing but such a
block: its probe would stand down (the runtime activates once per process) and its chaining
would never run, so the start-up code below it would be lost; before the skip, two such
files chained into each other until RecursionError.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import zlib
from pathlib import Path

from patcher.markers import SITECUSTOMIZE
from patcher.payload import Payload
from probe.runtime.core.contract import PROBE_VERSION
from probe.runtime.hooking.bootstrap import PACKAGE
from probe.runtime.hooking.chain import MADE_BY_PROBE
from probe.runtime.registry import targets

RUNTIME = Path(__file__).resolve().parent / "runtime"
# Not part of the embedded package: the stub and the chain run on their own, and the
# package's __init__ holds only documentation.
_NOT_EMBEDDED = ("", "hooking.bootstrap", "hooking.chain")
_SIBLING_IMPORT = re.compile(r"^(\s*)(from|import) probe\.runtime\b", re.M)


class InjectionError(ValueError):
    """The probe's source cannot be embedded safely (it would end the literal early)."""


def _dotted(path: Path) -> str:
    """A runtime file's module name below ``probe.runtime`` ("core.rule"; "core" for its package)."""
    parts = path.relative_to(RUNTIME).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # the sources do not change while a process runs; read each once
def _files() -> dict[str, Path]:
    return {_dotted(path): path for path in RUNTIME.rglob("*.py")}


@functools.cache
def _source(name: str) -> str:
    return _files()[name].read_text(encoding="utf-8")


def runtime_modules() -> tuple[str, ...]:
    """The names of the runtime modules embedded in the injected text, packages included
    ("core" for ``core/__init__.py``, "core.rule")."""
    return tuple(sorted(name for name in _files() if name not in _NOT_EMBEDDED))


@functools.cache
def embedded_sources() -> dict[str, str]:
    """Each embedded module's source, as it runs injected (sibling imports renamed)."""
    return {name: _SIBLING_IMPORT.sub(rf"\1\2 {PACKAGE}", _source(name)) for name in runtime_modules()}


@functools.cache
def packed_sources() -> str:
    """The embedded modules as the injected text holds them (see ``bootstrap.unpack``)."""
    text = json.dumps(embedded_sources(), sort_keys=True, separators=(",", ":"))
    return base64.b85encode(zlib.compress(text.encode("utf-8"), 9)).decode("ascii")


def _literal(source: str, name: str) -> str:
    # A raw triple-quoted literal keeps the source readable in the target file; it only
    # breaks on a triple single quote or a trailing backslash, which we refuse.
    if "'''" in source or source.rstrip("\n").endswith("\\"):
        raise InjectionError(f"{name} cannot be embedded: it contains ''' or ends in a backslash")
    return "r'''" + source + "'''"


@functools.cache
def body_digest() -> str:
    """A short hash of what gets injected: changes whenever any embedded file does."""
    names = ("hooking.bootstrap", "hooking.chain", *runtime_modules())
    text = "\0".join(f"{name}\0{_source(name)}" for name in names)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sitecustomize_text(chain: bool = False) -> str:
    """The exact block injected into a sitecustomize.py, markers included.

    ``chain=True`` is for a sitecustomize.py the probe creates itself (``install`` into an
    empty directory, ``run``): it then also runs the sitecustomize.py it shadows, and says
    on its second line that the probe made it (``chain.MADE_BY_PROBE``), so that another
    probe-made file's chaining skips it.
    """
    bootstrap = _literal(_source("hooking.bootstrap"), "bootstrap.py")
    chained = _literal(_source("hooking.chain"), "chain.py") if chain else '""'
    return (
        f"{SITECUSTOMIZE.begin_line(PROBE_VERSION, body_digest())}\n"
        + (f"{MADE_BY_PROBE}\n" if chain else "")
        + "# Installed by lm-eval-probe: ends max-token non-termination inside lm-eval.\n"
        "# Disable with HYPERLOOM_EVAL_PROBE=0. Source: probe/runtime/ in lm-eval-probe.\n"
        f"# Runtime modules (packed): {', '.join(embedded_sources())}.\n"
        "def _lm_eval_probe_start(origin):\n"
        f"    bootstrap = {bootstrap}\n"
        f"    modules = {packed_sources()!r}\n"
        f"    chain = {chained}\n"
        '    namespace = {"__name__": "_hyperloom_eval_probe_boot"}\n'
        '    exec(compile(bootstrap, f"{origin} (lm-eval-probe bootstrap)", "exec"), namespace)\n'
        f'    namespace["boot"](modules, origin, chain, {targets()!r})\n'
        "\n"
        "\n"
        "try:\n"
        '    _lm_eval_probe_start(globals().get("__file__") or "sitecustomize.py")\n'
        "except Exception as _lm_eval_probe_error:\n"
        "    import sys as _lm_eval_probe_sys\n"
        '    _lm_eval_probe_sys.stderr.write(f"[lm-eval-probe] start-up failed: {_lm_eval_probe_error!r}\\n")\n'
        "del _lm_eval_probe_start\n"
        f"{SITECUSTOMIZE.end_line}\n"
    )


def payload() -> Payload:
    """Everything the patcher needs to put the probe into a file."""
    return Payload(PROBE_VERSION, body_digest(), sitecustomize_text(chain=False), sitecustomize_text(chain=True))
