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

        skipped = {os.path.dirname(os.path.abspath(own_file))}
        while True:  # each round skips one more directory, so it ends
            others = [p for p in sys.path if os.path.abspath(p or os.curdir) not in skipped]
            spec = PathFinder.find_spec("sitecustomize", others)
            if spec is None or spec.loader is None or not spec.origin:
                return
            if not _made_by_probe(spec.origin):
                break
            skipped.add(os.path.dirname(os.path.abspath(spec.origin)))
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
