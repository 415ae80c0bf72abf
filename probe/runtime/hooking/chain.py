"""Runs the sitecustomize.py that the probe's own one shadows, skipping probe-made ones.

Compiled at start-up in every process, so it stays short; ``probe/inject.py`` says why.
"""

import os
import sys

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


def chain_next_sitecustomize(own_file: str) -> None:
    """Execute the next ``sitecustomize`` on sys.path that the probe did not make; never raises."""
    try:
        from importlib.machinery import PathFinder
        from importlib.util import module_from_spec

        here = os.path.dirname(os.path.abspath(own_file))
        entries = [os.path.abspath(p or os.curdir) for p in sys.path]
        # Only what this file shadows: the entries after its own (a chained file chaining
        # back to an earlier one would loop); and never a file twice in one process.
        after = entries[entries.index(here) + 1 :] if here in entries else entries
        ran = sys.__dict__.setdefault("_lm_eval_probe_chained", {os.path.abspath(own_file)})
        skipped = {here}
        while True:  # each round skips one more entry of sys.path, so it ends
            others = [p for p in after if p not in skipped]
            spec = PathFinder.find_spec("sitecustomize", others)
            if spec is None or spec.loader is None or not spec.origin:
                return
            if not _made_by_probe(spec.origin) and os.path.abspath(spec.origin) not in ran:
                break
            # The entry it came from: a package's is the folder above its own.
            found = os.path.dirname(os.path.abspath(spec.origin))
            entry = os.path.dirname(found) if spec.submodule_search_locations else found
            if entry in skipped or entry not in others:
                return  # no entry left to skip: a round would find it again
            skipped.add(entry)
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
