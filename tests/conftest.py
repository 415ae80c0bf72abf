"""Shared fixtures: the simulated server, the local task, and a probe installed in-process."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from probe import body
from probe.inject import sitecustomize_text
from probe.localtask import LocalTask, write_task
from probe.simserver import SimServer

PROBE_VARS = (
    body.ENV_SWITCH,
    body.ENV_MIN_SAMPLES,
    body.ENV_LENGTH_RATIO,
    body.ENV_MIN_MAX_TOKENS,
    *body.RESULT_DIR_VARS,
)


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
def probed(result_dir: Path) -> Iterator[body.Probe]:
    """The probe installed on the real lm-eval in this process; uninstalled afterwards."""
    assert body.install() is True
    assert body.PROBE is not None
    yield body.PROBE
    body.uninstall()


@pytest.fixture
def local_task(tmp_path: Path) -> LocalTask:
    return write_task(tmp_path / "task", n_docs=40)


@pytest.fixture
def site_dir(tmp_path: Path) -> Path:
    """A directory holding the probe's own sitecustomize.py, for subprocesses."""
    directory = tmp_path / "site"
    directory.mkdir()
    (directory / "sitecustomize.py").write_text(sitecustomize_text(chain=True), encoding="utf-8")
    return directory


def subprocess_env(site: Path | None, **extra: str) -> dict[str, str]:
    """The environment for a child Python: offline, the probe's site dir first if given."""
    env = {k: v for k, v in os.environ.items() if k not in PROBE_VARS and k != "PYTHONPATH"}
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env.update(extra)
    return env


PYTHON = sys.executable
