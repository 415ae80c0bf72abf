"""Child processes for tests: the interpreter, the probe's site directory, the probe's knobs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patcher.install import install
from probe.inject import payload
from probe.runtime.core import contract

PYTHON = sys.executable
PROBE_VARS = (
    contract.ENV_SWITCH,
    contract.ENV_MIN_SAMPLES,
    contract.ENV_LENGTH_RATIO,
    contract.ENV_MIN_MAX_TOKENS,
    contract.ENV_SLOW_START,
    contract.ENV_STREAM,
    contract.ENV_DETECTOR,
    contract.ENV_DETECTOR_NGRAM,
    contract.ENV_DETECTOR_WINDOW,
    contract.ENV_DETECTOR_DRIFT,
    contract.ENV_DETECTOR_THRESHOLD,
    contract.ENV_DETECTOR_REPEATS,
    contract.ENV_REPORT,
    contract.ENV_RUN_ID,
    *contract.RESULT_DIR_VARS,
)


def probe_site(directory: Path) -> Path:
    """``directory`` holding the probe's own sitecustomize.py (written by ``install``)."""
    outcome = install(directory, payload())
    assert outcome.code == 0, outcome.message
    return directory


def unprivileged() -> list[str]:
    """A command prefix that runs a child without root's capabilities (same uid), so that
    permission checks apply to it for real; empty when this process is not root."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot drop capabilities to test permissions")
    return [setpriv, "--bounding-set", "-all", "--inh-caps", "-all", "--"]


def read_json(directory: Path, *args: str) -> tuple[int, list[dict]]:
    """``eval-probe read DIRECTORY --json ARGS``: its exit code and its verdicts."""
    run = subprocess.run([PYTHON, "-m", "probe", "read", str(directory), "--json", *args], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    return run.returncode, json.loads(run.stdout)
