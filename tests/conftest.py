"""Shared fixtures: the simulated server, the local task, and a probe installed in-process.

Helpers that tests import live in ``tests/support/``; this file holds fixtures only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# Imported now, as pytest starts: hypothesis's pytest plugin imports it at the end of a session
# where no test did (pytest-xdist's controller, a pass without property tests), and pytest then
# rewrites its modules from deep inside the terminal summary, where CPython 3.11.7 fails at times
# with "SystemError: AST constructor recursion depth mismatch" after every test passed (status 1).
with contextlib.suppress(ImportError):
    import hypothesis  # noqa: F401
from support.inferencex import FIXTURES, SHAPES
from support.lm import probe_installed
from support.procs import PROBE_VARS, probe_site
from support.vllm import ECHO_CAP, serve

from probe.demo.localtask import LocalTask, write_task
from probe.demo.simserver import SimServer
from probe.runtime.scope import state


def _one_core_per_worker() -> None:
    """In each of several pytest-xdist workers (scripts/test.sh runs two), what a test starts
    computes on that worker's own core: vLLM's CPU backend binds its OpenMP threads to every core,
    and two engines (or torch runs) bound so spin against each other (2.5-3x slower side by side).
    A value the caller set is kept."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not worker.startswith("gw") or not count.isdigit() or not 1 < int(count) <= len(cores):
        return
    core = cores[int(worker[2:]) % len(cores)]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(core))
    os.environ.setdefault("OMP_NUM_THREADS", "1")


_one_core_per_worker()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``alone`` run last in their session (scripts/test.sh then lets them wait for a
    quiet machine: ``quiet_machine``), keeping the session's servers they share."""
    items.sort(key=lambda item: item.get_closest_marker("alone") is not None)


@pytest.fixture
def quiet_machine() -> None:
    """Waits until the file that LM_EVAL_PROBE_QUIET_AFTER names exists (scripts/test.sh makes it
    when the other vLLM lane is done); at once where the variable is unset."""
    flag = os.environ.get("LM_EVAL_PROBE_QUIET_AFTER")
    deadline = time.monotonic() + 3600
    while flag and not os.path.exists(flag):
        assert time.monotonic() < deadline, f"{flag} did not appear within an hour"
        time.sleep(1)


@pytest.fixture(autouse=True)
def clean_probe_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts with no probe knob set, whatever the developer's shell has."""
    for name in PROBE_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def sim() -> Iterator[Callable[..., SimServer]]:
    """Start simulated servers; all are stopped at teardown."""
    started: list[SimServer] = []

    def start(mode: str = "never_stop", **options: object) -> SimServer:
        server = SimServer(mode, **options).start()  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def result_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "results"
    monkeypatch.setenv("RESULT_DIR", str(directory))
    return directory


@pytest.fixture
def probed(result_dir: Path) -> Iterator[state.Probe]:
    """The probe installed on the real lm-eval in this process; uninstalled afterwards."""
    with probe_installed() as probe:
        yield probe


@pytest.fixture
def local_task(tmp_path: Path) -> LocalTask:
    return write_task(tmp_path / "task", n_docs=40)


@pytest.fixture
def site_dir(tmp_path: Path) -> Path:
    """A directory holding the probe's own sitecustomize.py, for subprocesses."""
    return probe_site(tmp_path / "site")


@pytest.fixture(scope="session")
def vllm_echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real vLLM server on the tiny Llama's echo variant, served as "sim", with room for
    ECHO_CAP tokens: one for the session (an engine start is about 80 s of a core), shared by
    the files that stream from it and the end-to-end run it never stops for."""
    yield from serve("echo", tmp_path_factory, "sim", max_model_len=ECHO_CAP + 192)


@pytest.fixture(params=SHAPES)
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A copy of one InferenceX-shaped fixture tree; returns its benchmark_lib.sh."""
    shutil.copytree(FIXTURES / request.param, tmp_path / request.param)
    return tmp_path / request.param / "benchmarks" / "benchmark_lib.sh"
