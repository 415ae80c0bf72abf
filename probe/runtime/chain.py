"""Runs the sitecustomize.py that the probe's own one shadows.

Only one ``sitecustomize`` module is ever imported, so a directory put first on
PYTHONPATH would otherwise silently disable the user's or the distribution's start-up
code. Injected (and compiled at start-up) only into a sitecustomize.py that the probe
created itself, by ``eval-probe install`` into an empty directory or ``eval-probe run``.
"""

import os
import sys


def chain_next_sitecustomize(own_file: str) -> None:
    """Execute the next ``sitecustomize`` found on sys.path after ours; never raises."""
    try:
        own = os.path.abspath(own_file)
        others = [p for p in sys.path if os.path.abspath(p or os.curdir) != os.path.dirname(own)]
        from importlib.machinery import PathFinder
        from importlib.util import module_from_spec

        spec = PathFinder.find_spec("sitecustomize", others)
        if spec is None or spec.loader is None or spec.origin == own:
            return
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
