"""Runs the sitecustomize.py that the probe's own one shadows, skipping probe-made ones.

Compiled at start-up where another sitecustomize may be imported (``bootstrap.shadows_another``).
It looks where Python would: the sys.path entries after the probe's own, then the other finders.
"""

import os
import sys
from importlib.machinery import ModuleSpec, PathFinder

MADE_BY_PROBE = "# lm-eval-probe made this file: it runs the probe, then the sitecustomize.py it shadows."
# patcher.markers.SITECUSTOMIZE.end_line (a test checks that they agree).
BLOCK_END = "# <<< lm-eval-probe sitecustomize <<<"


def _made_by_probe(source: str) -> bool:
    """Whether ``source`` is the probe's own chaining block and nothing else."""
    lines = source.strip().splitlines()
    return len(lines) > 2 and lines[1] == MADE_BY_PROBE and lines[-1].strip() == BLOCK_END


def _key(spec: ModuleSpec) -> str:
    """What names ``spec`` among those run: its file, or its loader's kind where it has none."""
    if spec.origin and os.path.isfile(spec.origin):  # also where a wrapping finder hides it
        return os.path.abspath(spec.origin)
    kind = type(spec.loader)
    return f"<{spec.origin or spec.name} from {kind.__module__}.{kind.__qualname__}>"


def _loaders_source(spec: ModuleSpec) -> str | None:
    """``spec``'s source as its loader gives it; None where it gives none (a compiled module)."""
    try:
        return spec.loader.get_source(spec.name) if hasattr(spec.loader, "get_source") else None
    except Exception:
        return None


def _probes(spec: ModuleSpec) -> bool:
    """Whether ``spec`` is a probe-made file (which the chain skips), read as its loader reads it."""
    source = _loaders_source(spec)
    try:
        if source is None and spec.origin and os.path.isfile(spec.origin):
            with open(spec.origin, encoding="utf-8", errors="replace") as handle:
                source = handle.read()
    except OSError:
        return False
    return source is not None and _made_by_probe(source)


def _on_path(entries: list[str]) -> ModuleSpec | None:
    """What Python would import as sitecustomize from the sys.path ``entries``, less probe-made files."""
    skipped: set[str] = set()
    while True:  # each round skips one more entry, so it ends
        others = [p for p in entries if p not in skipped]
        spec = PathFinder.find_spec("sitecustomize", others)
        if spec is None or not _probes(spec):
            return spec  # a namespace package too: Python would import it, and run nothing
        # The entry it came from: a package's is the folder above its own.
        found = os.path.dirname(os.path.abspath(str(spec.origin)))
        entry = os.path.dirname(found) if spec.submodule_search_locations else found
        if entry in skipped or entry not in others:
            return None  # no entry left to skip: a round would find it again
        skipped.add(entry)


def _from_other_finders() -> ModuleSpec | None:
    """What a finder besides the path's would import as sitecustomize (an editable install's)."""
    for finder in list(sys.meta_path):
        if finder is PathFinder or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec("sitecustomize", None, None)  # raising, it fails as Python's import would
        if spec is not None and not _probes(spec):
            return spec
    return None


def chain_next_sitecustomize(own_file: str) -> None:
    """Execute the ``sitecustomize`` Python would import but for the probe's, once; never raises."""
    try:
        from importlib.util import module_from_spec

        own = os.path.abspath(own_file)
        here = os.path.dirname(own)
        entries = [os.path.abspath(p or os.curdir) for p in sys.path]
        # Only what this file shadows: the entries after its own (a chained file chaining
        # back to an earlier one would loop), then the other finders; never a file twice.
        after = [p for p in (entries[entries.index(here) + 1 :] if here in entries else entries) if p != here]
        ran = sys.__dict__.setdefault("_lm_eval_probe_chained", {own})
        spec = _on_path(after) or _from_other_finders()
        if spec is None or spec.loader is None or _key(spec) in ran:
            return  # run again (a reload), what Python would import has run: nothing more

        ran.add(_key(spec))
        ours = sys.modules.get("sitecustomize")
        module = module_from_spec(spec)
        sys.modules["sitecustomize"] = module  # and left there: `import sitecustomize` is the user's
        try:
            if hasattr(spec.loader, "exec_module"):
                spec.loader.exec_module(module)
            else:  # a loader of the old kind, as Python's import still runs it
                spec.loader.load_module("sitecustomize")
        except BaseException:
            if ours is not None:
                sys.modules["sitecustomize"] = ours
            raise
    except Exception as error:
        sys.stderr.write(f"[lm-eval-probe] the sitecustomize.py shadowed by ours failed: {error!r}\n")
