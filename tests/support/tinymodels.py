"""The tiny Llamas of scripts/tiny_llama.py, each built once per test session and Python.

Building one starts a Python with torch and transformers (6 s alone, twice that beside another
worker), and the vLLM and Hugging Face passes ask for the same few models from many test files:
pytest-xdist's workers share one directory per session, the first worker to ask for a model
builds it while the others wait, and every later ask gets the same directory. A test must not
change a model's files.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tiny_llama.py"


SHARED = "LM_EVAL_PROBE_TINY_LLAMAS"  # a directory that several test sessions share


def session_directory(factory: pytest.TempPathFactory) -> Path:
    """Where the tiny Llamas are built: the directory named by LM_EVAL_PROBE_TINY_LLAMAS (the
    vLLM pass's two pytest runs side by side share one: scripts/test.sh), else one of this test
    session that all its pytest-xdist workers share (each worker's base temporary directory lies
    in it), or the base temporary directory without xdist."""
    if os.environ.get(SHARED):
        return Path(os.environ[SHARED])
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def tiny_llama(python: str, variant: str, factory: pytest.TempPathFactory) -> Path:
    """The directory of the tiny Llama ``variant`` as ``python`` builds it (its transformers
    writes the files), built on the session's first ask; several of one ``python`` share a parent."""
    return tiny_llamas(python, (variant,), factory) / variant


def tiny_llamas(python: str, variants: tuple[str, ...], factory: pytest.TempPathFactory) -> Path:
    """The directory that holds the tiny Llamas ``variants`` as ``python`` builds them, one
    folder each: those not built yet this session are built by one process (torch and
    transformers start once, not once a model)."""
    key = hashlib.sha256(python.encode() + b"\0" + SCRIPT.read_bytes()).hexdigest()[:16]
    parent = session_directory(factory) / "tiny-llamas" / key
    parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as locks:
        for variant in sorted(set(variants)):  # one order for every worker: no deadlock
            lock = locks.enter_context(open(parent / f".{variant}.lock", "w"))
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the worker dies
        missing = sorted(v for v in set(variants) if not (parent / v).is_dir())
        if missing:
            # Built aside and renamed: a build that failed or was killed leaves no model behind.
            building = parent / f".building-{os.getpid()}"
            shutil.rmtree(building, ignore_errors=True)
            command = [python, str(SCRIPT), str(building), *(f"--variant={v}" for v in missing)]
            if len(missing) == 1:
                command[2] = str(building / missing[0])
            subprocess.run(command, check=True)
            for variant in missing:
                (building / variant).rename(parent / variant)
            shutil.rmtree(building, ignore_errors=True)
    return parent
