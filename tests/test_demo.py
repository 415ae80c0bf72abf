"""`eval-probe demo`, the README's main job, at a small scale."""

from __future__ import annotations

import re
import socket
import subprocess

import pytest
from support.procs import PYTHON

from probe import exitcodes
from probe.demo.compare import since, unreachable
from probe.demo.localtask import offline_env


def test_demo_compares_unprobed_and_probed_runs(tmp_path) -> None:
    run = subprocess.run(
        [PYTHON, "-m", "probe", "demo", "--docs", "24", "--max-tokens", "1024", "--concurrency", "8"],
        env=offline_env(None, TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {m[0]: m[1:] for m in re.findall(r"^\s*(unprobed|probed)\s+(\d+)\s+([\d,]+)", run.stdout, re.M)}
    assert rows["unprobed"] == ("24", "24,576")  # every request ran to the cap
    assert int(rows["probed"][0]) < 24 and int(rows["probed"][1].replace(",", "")) < 24_576
    assert "status:  below_floor" in run.stdout and "16 of 16 generations it observed" in run.stdout
    # The progress line counts each run's own requests, never the unprobed run's before it.
    probed_progress = [int(n) for n in re.findall(r"(?<!un)probed: +\d+ s, server: (\d+) requests", run.stderr)]
    assert probed_progress and max(probed_progress) <= int(rows["probed"][0]), run.stderr[-2000:]


@pytest.mark.release_independent
@pytest.mark.parametrize("given", [["--model", "m"], ["--base-url", "http://127.0.0.1:9"]])
def test_model_and_base_url_come_together(given: list[str]) -> None:
    run = subprocess.run([PYTHON, "-m", "probe", "demo", *given], capture_output=True, text=True, timeout=120)
    assert run.returncode == exitcodes.USAGE and "needs" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.release_independent
def test_an_unreachable_server_is_named_as_such() -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    command = [PYTHON, "-m", "probe", "demo", "--base-url", url, "--model", "m"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == exitcodes.DEMO_CANNOT_RUN and f"cannot reach the server at {url}" in run.stderr
    assert "n/a" not in run.stdout + run.stderr


@pytest.mark.release_independent
def test_a_reachable_server_is_not_refused_for_its_status(sim) -> None:
    # The simulated server answers /v1/models with 404: still a server.
    assert unreachable(sim("healthy").base_url) is None
    assert "refused" in (unreachable("http://127.0.0.1:9") or "").lower()
    assert since((10, None), (25, 7)) == (15, None)
