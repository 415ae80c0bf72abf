"""Runs the sitecustomize.py that the probe's own one shadows, skipping probe-made ones.

Compiled at start-up where another sitecustomize may be imported (``bootstrap.shadows_another``).
It looks where Python would: the sys.path entries after the probe's own, then the other finders.
"""

from __future__ import annotations

import os
import sys
from importlib.machinery import ModuleSpec, PathFinder

MADE_BY_PROBE = "# lm-eval-probe made this file: it runs the probe, then the sitecustomize.py it shadows."
# patcher.markers.SITECUSTOMIZE.end_line (a test checks that they agree).
BLOCK_END = "# <<< lm-eval-probe sitecustomize <<<"


def _made_by_probe(path: str) -> bool:
    """Whether ``path`` holds the probe's own chaining block and nothing else."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().strip().splitlines()
    except OSError:
        return False
    return len(lines) > 2 and lines[1] == MADE_BY_PROBE and lines[-1].strip() == BLOCK_END


def _runs(spec: ModuleSpec | None, ran: set[str]) -> bool:
    """Whether ``spec`` is a sitecustomize to run: loadable, not the probe's, not run before."""
    if spec is None or spec.loader is None or not spec.origin:
        return False
    return not _made_by_probe(spec.origin) and os.path.abspath(spec.origin) not in ran


def _on_path(entries: list[str], ran: set[str]) -> ModuleSpec | None:
    """The first sitecustomize on the sys.path ``entries`` to run, skipping the probe's own."""
    skipped: set[str] = set()
    while True:  # each round skips one more entry, so it ends
        others = [p for p in entries if p not in skipped]
        spec = PathFinder.find_spec("sitecustomize", others)
        if _runs(spec, ran):
            return spec
        if spec is None or not spec.origin:
            return None
        # The entry it came from: a package's is the folder above its own.
        found = os.path.dirname(os.path.abspath(spec.origin))
        entry = os.path.dirname(found) if spec.submodule_search_locations else found
        if entry in skipped or entry not in others:
            return None  # no entry left to skip: a round would find it again
        skipped.add(entry)


def _from_other_finders(ran: set[str]) -> ModuleSpec | None:
    """The sitecustomize that a finder besides the path's would import (an editable install's)."""
    for finder in list(sys.meta_path):
        if finder is PathFinder or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec("sitecustomize", None)
        except Exception:
            continue  # a finder that fails here would have failed Python's own import too
        if _runs(spec, ran):
            return spec
    return None


def chain_next_sitecustomize(own_file: str) -> None:
    """Execute the next ``sitecustomize`` that the probe did not make; never raises."""
    try:
        from importlib.util import module_from_spec

        here = os.path.dirname(os.path.abspath(own_file))
        entries = [os.path.abspath(p or os.curdir) for p in sys.path]
        # Only what this file shadows: the entries after its own (a chained file chaining
        # back to an earlier one would loop), then the other finders; never a file twice.
        after = [p for p in (entries[entries.index(here) + 1 :] if here in entries else entries) if p != here]
        ran = sys.__dict__.setdefault("_lm_eval_probe_chained", {os.path.abspath(own_file)})
        spec = _on_path(after, ran) or _from_other_finders(ran)
        if spec is None or spec.loader is None or spec.origin is None:
            return
        ran.add(os.path.abspath(spec.origin))
        ours = sys.modules.get("sitecustomize")
        module = module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        try:
            spec.loader.exec_module(module)
        finally:
            if ours is not None:
                sys.modules["sitecustomize"] = ours
    except Exception as error:
        sys.stderr.write(f"[lm-eval-probe] the sitecustomize.py shadowed by ours failed: {error!r}\n")
