"""Builds the text injected into a sitecustomize.py from the runtime's own source files.

The text is made from ``probe/runtime/`` each time, never kept as a second copy. The start-up
stub is the body of a function, so Python keeps it compiled with the file. The other modules
become the private package ``_hyperloom_eval_probe``, so they never need ``probe`` where they
run. They travel packed, less their comments and docstrings, so parsing the file stays cheap.
The chain goes only into a sitecustomize.py the probe creates itself. See docs/how-it-works.md.
"""

from __future__ import annotations

import ast
import base64
import functools
import gc
import hashlib
import io
import json
import re
import textwrap
import tokenize
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


def compact(source: str) -> str:
    """``source`` without its comments and docstrings, every line where it was.

    Half the packed text is prose, which every process would otherwise tokenise at start-up. The
    lines stay put, so a traceback's line numbers are those of the file in ``probe/runtime/``.
    """
    # Rows as tokenize and ast count them (at "\n" only); ast's columns are UTF-8 byte offsets.
    text = source.split("\n")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, column = token.start
            text[row - 1] = text[row - 1][:column].rstrip()
    lines = [line.encode("utf-8") for line in text]
    for node in ast.walk(_parse(source)):
        if (doc := docstring(node)) is None or doc.end_lineno is None or doc.end_col_offset is None:
            continue
        first, last = doc.lineno - 1, doc.end_lineno - 1
        if lines[last][doc.end_col_offset :].strip():
            raise InjectionError(f"code follows a docstring on line {doc.end_lineno}: cannot compact it")
        lines[first] = lines[first][: doc.col_offset] + b"''"
        lines[first + 1 : last + 1] = [b""] * (last - first)
    return "\n".join(line.decode("utf-8") for line in lines)


def _parse(source: str) -> ast.Module:
    """``ast.parse`` with the garbage collector held off: in CPython 3.11 a collection during the
    build (finalizers running Python code) can fail it with "AST constructor recursion depth
    mismatch" (gh-106905), which a test run met once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


def docstring(node: ast.AST) -> ast.Expr | None:
    """The statement that is ``node``'s docstring, if it has one."""
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            return first
    return None


@functools.cache
def embedded_sources() -> dict[str, str]:
    """Each embedded module's source, as it runs injected: compacted, sibling imports renamed."""
    return {name: _SIBLING_IMPORT.sub(rf"\1\2 {PACKAGE}", compact(_source(name))) for name in runtime_modules()}


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


def _stub() -> str:
    """The start-up stub as the body of a function: real code, which Python caches compiled."""
    source = _source("hooking.bootstrap")
    if re.search(r"^\s*(from __future__|global |nonlocal )", source, re.M):
        raise InjectionError("bootstrap.py cannot run inside a function: no __future__, global or nonlocal")
    return textwrap.indent(source, "    ")


def sitecustomize_text(chain: bool = False) -> str:
    """The exact block injected into a sitecustomize.py, markers included.

    ``chain=True`` is for a sitecustomize.py the probe creates itself (``install`` into an empty
    directory, ``run``). It then also runs the sitecustomize.py it shadows. Its second line says the
    probe made it (``chain.MADE_BY_PROBE``), so another probe-made file's chaining skips it. See
    docs/how-it-works.md.
    """
    chained = _literal(compact(_source("hooking.chain")), "chain.py") if chain else '""'
    return (
        f"{SITECUSTOMIZE.begin_line(PROBE_VERSION, body_digest())}\n"
        + (f"{MADE_BY_PROBE}\n" if chain else "")
        + "# Installed by lm-eval-probe: ends max-token non-termination inside lm-eval.\n"
        "# Disable with HYPERLOOM_EVAL_PROBE=0. Source: probe/runtime/ in lm-eval-probe.\n"
        f"# Runtime modules (packed): {', '.join(embedded_sources())}.\n"
        "def _lm_eval_probe_start(origin):\n"
        f"{_stub()}"
        f"    modules = {packed_sources()!r}\n"
        f"    chain = {chained}\n"
        f"    boot(modules, origin, chain, {targets()!r})\n"
        "\n"
        "\n"
        "def _lm_eval_probe_boot(start):\n"
        "    # The stub runs with globals of its own: the file it is appended to keeps its names,\n"
        "    # and none of them (a helper called set) reaches the stub.\n"
        "    import builtins\n"
        "    import sys\n"
        "\n"
        "    try:\n"
        '        own = {"__builtins__": builtins, "__name__": "_hyperloom_eval_probe_boot"}\n'
        '        origin = builtins.globals().get("__file__") or "sitecustomize.py"\n'
        "        (lambda: None).__class__(start.__code__, own)(origin)\n"
        "    except builtins.Exception as error:\n"
        '        sys.stderr.write(f"[lm-eval-probe] start-up failed: {error!r}\\n")\n'
        "\n"
        "\n"
        "_lm_eval_probe_boot(_lm_eval_probe_start)\n"
        "del _lm_eval_probe_start, _lm_eval_probe_boot\n"
        f"{SITECUSTOMIZE.end_line}\n"
    )


def payload() -> Payload:
    """Everything the patcher needs to put the probe into a file."""
    return Payload(PROBE_VERSION, body_digest(), sitecustomize_text(chain=False), sitecustomize_text(chain=True))
