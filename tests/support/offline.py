"""What the tests on lm-eval's in-process vLLM backend (``--model vllm``) share: the size of
their runs, the tiny Llamas, and one run.

Each run is ``python -m lm_eval --model vllm`` in the vLLM environment (named by
LM_EVAL_PROBE_VLLM_PYTHON), through ``eval-probe run`` when probed, with vLLM's own counters
written at its end (scripts/lm_eval_counted.py).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from probe.demo.localtask import LocalTask, offline_env
from probe.demo.servercounters import parse_vllm_metrics
from probe.runtime.core import contract
from support import tinymodels
from support.procs import PYTHON
from support.vllm import SCRIPTS, vllm_python

MAX_TOKENS = 1024
DOCS = 48
MAX_NUM_SEQS = 8  # six waves of generations: the trip comes after two
MIN_SAMPLES = contract.Settings().min_samples
VARIANTS = ("never_stop", "never_stop_wide", "stops", "babble")


def tiny_llamas(factory: pytest.TempPathFactory) -> Path:
    """The directory that holds the tiny Llamas these tests run, one folder per variant."""
    return tinymodels.tiny_llamas(vllm_python(), VARIANTS, factory)


def evaluate(
    model: Path,
    task: LocalTask,
    output: Path,
    probed: bool,
    site: Path | None = None,
    gen_kwargs: str = "",
    max_num_seqs: int = MAX_NUM_SEQS,
    batch_size: str = "auto",
    also: tuple[LocalTask, ...] = (),
    max_tokens: int = MAX_TOKENS,
    **knobs: str,
) -> tuple[subprocess.CompletedProcess, dict[str, float]]:
    """One lm-eval run on the in-process vLLM backend; returns it and vLLM's own counters.

    ``site``: a directory put on PYTHONPATH (after the probe's own, which runs it too);
    ``gen_kwargs``: added to lm-eval's ``--gen_kwargs``; ``also``: more tasks in the run;
    ``max_tokens``: each generation's budget (below MIN_MAX_TOKENS, a run that is to be judged
    lowers that knob: the engine's steps are most of a run's time after its start-up);
    ``knobs``: the probe's variables.
    """
    metrics = output.with_suffix(".metrics.txt")
    arguments = task.lm_eval_vllm_arguments(
        model, output, max_tokens, max_num_seqs, "--log_samples", gen_kwargs=gen_kwargs, batch_size=batch_size,
        also=also,
    )  # fmt: skip
    lm_eval = [vllm_python(), str(SCRIPTS / "lm_eval_counted.py"), str(metrics), "--", *arguments]
    command = [PYTHON, "-m", "probe", "run", "--result-dir", str(output), "--", *lm_eval] if probed else lm_eval
    env = offline_env(None, VLLM_CPU_KVCACHE_SPACE="1", **knobs)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run, parse_vllm_metrics(metrics.read_text())
