"""The InferenceX-shaped ``benchmark_lib.sh`` fixtures: where they lie, and what their
``_patch_lm_eval`` makes when bash runs it."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHAPES = ("heredoc", "file")  # the two shapes of _patch_lm_eval in InferenceX's history


def patched_site(script: Path) -> Path:
    """Source the script in bash and call _patch_lm_eval; returns the sitecustomize.py made."""
    shell = f'source "{script}" && _patch_lm_eval && printf %s "$PYTHONPATH"'
    run = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert run.returncode == 0, run.stderr
    return Path(run.stdout.split(":")[0]) / "sitecustomize.py"
