"""End to end on a real vLLM server serving a locally built tiny Llama (CPU build here).

Needs the vLLM environment that scripts/test.sh makes; its Python is named by
LM_EVAL_PROBE_VLLM_PYTHON. Deselect with ``-m "not vllm"`` where there is none.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.procs import PYTHON
from support.vllm import SCRIPTS, answers

from probe.demo.localtask import EXCLAIM_TASK, offline_env, write_task
from probe.demo.servercounters import vllm_metrics
from probe.runtime.core import contract

sys.path.insert(0, str(SCRIPTS))
import vllm_server

pytestmark = pytest.mark.vllm
MAX_TOKENS = 1024
DOCS = 64
CONCURRENCY = 16


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("task"), DOCS)


@pytest.fixture(scope="module")
def echo(vllm_echo: vllm_server.Server) -> vllm_server.Server:
    """The session's echo server (the streaming tests share it: one engine start for all): each
    of the task's prompts ends in ":", which it repeats to the cap, and each of the exclaiming
    task's in "!", after which it answers "~" and stops."""
    return vllm_echo


@pytest.fixture(scope="module")
def exclaiming(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("exclaim"), DOCS, task=EXCLAIM_TASK)


def evaluate(server, task, output: Path, probed: bool) -> tuple[subprocess.CompletedProcess, float]:
    """One lm-eval run, through `eval-probe run` when probed; returns it and vLLM's token delta."""
    before = vllm_metrics(server.base_url)["generation_tokens"]
    lm_eval = task.lm_eval_command(
        server.base_url, server.name, output, MAX_TOKENS, CONCURRENCY, "--log_samples", model_args="max_retries=3"
    )
    command = [PYTHON, "-m", "probe", "run", "--", *lm_eval] if probed else lm_eval
    run = subprocess.run(command, env=offline_env(None), capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return run, vllm_metrics(server.base_url)["generation_tokens"] - before


def test_never_stopping_model_trips_and_saves_tokens(echo, task, tmp_path) -> None:
    # Unprobed, every request runs to the cap: DOCS * MAX_TOKENS tokens by vLLM's own count (the
    # echo model repeats each prompt's last character; tests/test_tiny_llama.py checks it).
    run, probed_tokens = evaluate(echo, task, tmp_path / "probed", probed=True)
    assert "summary: TRIPPED (non_terminating)" in run.stderr
    # One wave of CONCURRENCY generations, plus the partial tokens of those cancelled.
    assert probed_tokens <= 1.15 * CONCURRENCY * MAX_TOKENS < DOCS * MAX_TOKENS / 3
    read = subprocess.run([PYTHON, "-m", "probe", "read", str(tmp_path / "probed"), "--json"], capture_output=True)
    (verdict,) = json.loads(read.stdout)  # one task: one verdict
    assert read.returncode == 1 and verdict["status"] == "below_floor"
    assert verdict["pathology"]["pathology"] == contract.PATHOLOGY and verdict["pathology"]["max_tokens"] == [
        MAX_TOKENS
    ]
    assert verdict["results_file"] and Path(verdict["results_file"]).exists()


def test_stopping_model_does_not_trip_and_answers_as_unprobed(echo, exclaiming, tmp_path) -> None:
    evaluate(echo, exclaiming, tmp_path / "plain", probed=False)
    run, _ = evaluate(echo, exclaiming, tmp_path / "probed", probed=True)
    assert "the probe did not trip: 0 of 64 generations observed were cut off" in run.stderr
    assert not (tmp_path / "probed" / contract.SIDECAR_NAME).exists()
    assert answers(tmp_path / "probed") == answers(tmp_path / "plain") == ["~"] * DOCS
