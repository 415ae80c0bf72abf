"""Child processes for tests: the interpreter, the probe's site directory, the probe's knobs."""

from __future__ import annotations

import sys
from pathlib import Path

from patcher.install import install
from probe.inject import payload
from probe.runtime import contract

PYTHON = sys.executable
PROBE_VARS = (
    contract.ENV_SWITCH,
    contract.ENV_MIN_SAMPLES,
    contract.ENV_LENGTH_RATIO,
    contract.ENV_MIN_MAX_TOKENS,
    contract.ENV_SLOW_START,
    contract.ENV_REPORT,
    *contract.RESULT_DIR_VARS,
)


def probe_site(directory: Path) -> Path:
    """``directory`` holding the probe's own sitecustomize.py (written by ``install``)."""
    outcome = install(directory, payload())
    assert outcome.code == 0, outcome.message
    return directory
