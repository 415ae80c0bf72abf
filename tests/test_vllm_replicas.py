"""End to end on lm-eval's data-parallel vLLM backend (``--model vllm`` with
``data_parallel_size=2``): two replicas of a tiny Llama, each a Ray task on a local Ray
cluster started beforehand with two declared GPUs (``ray start --head --num-gpus 2``), as a
cluster is started beside lm-eval, which joins it. CPU build of vLLM, lm-eval 0.4.13.

Two runs in all (CI time): a never-stopping model, whose replicas trip together; a stopping
one, whose answers are the model's own. Deselect with ``-m "not vllm"``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.procs import PYTHON
from support.tinymodels import tiny_llama
from support.vllm import answers, vllm_python

from probe.demo.localtask import LocalTask, offline_env, write_task
from probe.runtime.core import contract
from probe.runtime.core.contract import EVIDENCE_KEY

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
MAX_TOKENS = 1024
DOCS = 24  # twelve per replica
MAX_NUM_SEQS = 4  # three waves per replica: the rule's MIN_SAMPLES come after two
MIN_SAMPLES = contract.Settings().min_samples


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Ray cluster with two declared GPUs, started apart from lm-eval (so that its
    workers do not inherit lm-eval's environment), stopped by its own process group."""
    ray = str(Path(vllm_python()).with_name("ray"))
    port = free_port()
    address = f"127.0.0.1:{port}"
    with open(tmp_path_factory.mktemp("ray") / "head.log", "w") as log:
        head = subprocess.Popen(
            [ray, "start", "--head", "--block", "--num-gpus", "2", "--num-cpus", "2", "--node-ip-address",
             "127.0.0.1", "--port", str(port), "--include-dashboard", "false", "--disable-usage-stats"],
            # The replicas run in its workers, with its environment, not lm-eval's.
            env=offline_env(None, VLLM_CPU_KVCACHE_SPACE="1"), start_new_session=True, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            for _ in range(120):
                if subprocess.run([ray, "status", "--address", address], capture_output=True).returncode == 0:
                    break
                assert head.poll() is None, "ray start --head ended"
                time.sleep(1)
            yield address
        finally:
            # Ray's own shutdown on SIGTERM took 33 s here; the cluster holds nothing to keep.
            os.killpg(head.pid, signal.SIGTERM)
            try:
                head.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(head.pid, signal.SIGKILL)
                head.wait(30)


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> LocalTask:
    return write_task(tmp_path_factory.mktemp("task"), DOCS)


def evaluate(model: Path, task: LocalTask, output: Path, address: str) -> subprocess.CompletedProcess:
    """One probed lm-eval run on two replicas (through ``eval-probe run``)."""
    arguments = task.lm_eval_vllm_arguments(model, output, MAX_TOKENS, MAX_NUM_SEQS, "--log_samples")
    at = arguments.index("--model_args") + 1
    arguments[at] += ",data_parallel_size=2"
    command = [PYTHON, "-m", "probe", "run", "--result-dir", str(output), "--", vllm_python(), "-m", "lm_eval"]
    env = offline_env(None, VLLM_CPU_KVCACHE_SPACE="1", RAY_ADDRESS=address)
    run = subprocess.run([*command, *arguments], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[lm-eval-probe] internal error" not in run.stderr and "did not load the probe" not in run.stderr
    return run


def evidence_of(output: Path) -> tuple[dict, dict]:
    """The verdict ``eval-probe read --json`` gives, and the evidence in lm-eval's results file."""
    read = subprocess.run([PYTHON, "-m", "probe", "read", str(output), "--json"], capture_output=True, text=True)
    (verdict,) = json.loads(read.stdout)
    return verdict, json.loads(Path(verdict["results_file"]).read_text())[EVIDENCE_KEY]


def test_never_stopping_replicas_trip_together_and_the_results_say_what_each_saw(
    ray_address, task, tmp_path, tmp_path_factory
) -> None:
    model = tiny_llama(vllm_python(), "never_stop", tmp_path_factory)
    run = evaluate(model, task, tmp_path / "out", ray_address)
    assert "summary: TRIPPED (non_terminating)" in run.stderr
    # Both replicas' requests were judged together, and each aborted what was unfinished.
    given = answers(tmp_path / "out")
    blank = given.count("")
    assert sorted(given) == [""] * blank + ["a" * MAX_TOKENS] * (DOCS - blank)
    # The loop detector counts a request when it flags it, still running: the trip may come
    # while the flagged ones of a wave (at most MAX_NUM_SEQS per replica) are in flight. On a busy
    # machine the last wave may also have ended before the sample's last outcome (none blank):
    # what each replica saw is then still counted below. (Open: issue 33, the sample and replicas.)
    assert 0 <= blank <= DOCS - MIN_SAMPLES + 2 * MAX_NUM_SEQS
    # One sidecar for the run, written by lm-eval's process, with the blanks counted.
    assert sorted(p.name for p in (tmp_path / "out").glob(contract.SIDECAR_NAME + "*")) == [contract.SIDECAR_NAME]
    sidecar = json.loads((tmp_path / "out" / contract.SIDECAR_NAME).read_text())
    assert sidecar["verdict"]["backend"] == "vllm" and sidecar["verdict"]["model"] == str(model)
    assert sidecar["final"]["short_circuited_requests"] == sidecar["final"]["cancelled_in_flight"] == blank
    verdict, evidence = evidence_of(tmp_path / "out")
    assert verdict["status"] == "below_floor"
    # What every replica saw, merged per task, in lm-eval's own results file.
    seen = evidence["tasks"][verdict["task"]]
    assert seen["tripped"] is True and seen["cancelled_in_flight"] == seen["short_circuited"] == blank
    assert seen["finish_reasons"] == {"length": DOCS - blank} and seen["observations"] == DOCS - blank


def test_stopping_replicas_answer_as_unprobed_and_every_answer_is_observed(
    ray_address, task, tmp_path, tmp_path_factory
) -> None:
    model = tiny_llama(vllm_python(), "stops", tmp_path_factory)
    run = evaluate(model, task, tmp_path / "out", ray_address)
    assert f"the probe did not trip: 0 of {DOCS} generations observed were cut off" in run.stderr
    assert not list((tmp_path / "out").glob(contract.SIDECAR_NAME + "*"))
    # The stopping model's own answer to every prompt, as its unprobed runs give it
    # (test_vllm_offline.py compares them run against run).
    assert answers(tmp_path / "out") == [" 7"] * DOCS
    verdict, evidence = evidence_of(tmp_path / "out")
    assert evidence["tasks"][verdict["task"]]["finish_reasons"] == {"stop": DOCS}
