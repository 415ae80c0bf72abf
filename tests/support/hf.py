"""What the tests on lm-eval's Hugging Face backend share: its Python, tasks, and a run.

``--model hf`` needs torch, transformers and accelerate: the environment named by
LM_EVAL_PROBE_HF_PYTHON, else this interpreter when it has them (.venv-lm-eval-0.4.9.2).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from probe.demo.localtask import offline_env
from support import tinymodels
from support.procs import PYTHON

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
NEEDS = ("torch", "transformers", "accelerate")


def hf_python() -> str:
    """The Python that runs lm-eval's Hugging Face backend; fails the test without one."""
    named = os.environ.get("LM_EVAL_PROBE_HF_PYTHON")
    if named:
        return named
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        pytest.fail(
            f"{sys.executable} lacks {', '.join(missing)}: set LM_EVAL_PROBE_HF_PYTHON to a Python that has them"
        )
    return sys.executable


def borrowed(name: str, builtin: str) -> str:
    """A task's name for the installed lm-eval: 0.4.9.x's command line fails on a task name it
    does not know (see probe.demo.localtask.BORROWED_NAMES), so there it borrows a built-in one."""
    release = tuple(int(part) for part in version("lm_eval").split(".")[:3])
    return builtin if release < (0, 4, 10) else name


def _config(task: str, data: Path, output_type: str, **fields: object) -> dict:
    """A task reading ``data`` (JSONL) with no few-shot examples; written as JSON, which is YAML."""
    return {
        "task": task,
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(data.resolve())}},
        "test_split": "test",
        "fewshot_split": "test",
        "num_fewshot": 0,
        "output_type": output_type,
        "doc_to_text": "{{text}}",
        "doc_to_target": "{{answer}}",
        "metadata": {"version": 1},
        **fields,
    }


@dataclass(frozen=True)
class Task:
    yaml: Path
    name: str


def write_prompts_task(directory: Path, texts: list[str], name: str = "probe_prompts") -> Task:
    """A generate task whose prompts are ``texts`` exactly (the echo model answers by their
    last character), stopping at "Question:"."""
    fields = {
        "generation_kwargs": {"until": ["Question:"], "temperature": 0},
        "metric_list": [{"metric": "exact_match"}],
    }
    docs = [{"text": t, "answer": "x"} for t in texts]
    return write_task_file(directory, name, "gsm8k_cot", "generate_until", fields, docs)


def write_choice_task(directory: Path, n_docs: int) -> Task:
    """A loglikelihood (multiple-choice) task of ``n_docs`` questions."""
    docs = [{"text": f"Pick {i}:", "answer": i % 4} for i in range(n_docs)]
    fields = {"doc_to_choice": ["~", "x", "a", "7"], "metric_list": [{"metric": "acc"}]}
    return write_task_file(directory, "probe_choice", "arc_easy", "multiple_choice", fields, docs)


def write_task_file(directory: Path, name: str, builtin: str, output_type: str, fields: dict, docs: list[dict]) -> Task:
    """Write ``docs`` (JSONL, each with ``text`` and ``answer``) and the task ``name`` reading them
    (``_config`` plus ``fields``; named ``builtin`` where the release needs a known name)."""
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{name}.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in docs), encoding="utf-8")
    task = borrowed(name, builtin)
    yaml = directory / f"{name}.yaml"
    yaml.write_text(json.dumps(_config(task, data, output_type, **fields), indent=2), encoding="utf-8")
    return Task(yaml.resolve(), task)


def tiny_llama(variant: str, factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama ``variant`` as this backend's Python builds it, once per session."""
    return tinymodels.tiny_llama(hf_python(), variant, factory)


def tiny_llamas(variants: tuple[str, ...], factory: pytest.TempPathFactory) -> Path:
    """The directory that holds the tiny Llamas ``variants`` as this backend's Python builds
    them, one folder each, built together on the session's first ask."""
    return tinymodels.tiny_llamas(hf_python(), variants, factory)


def evaluate_hf(
    model: Path,
    tasks: list[Path],
    output: Path,
    max_tokens: int,
    batch_size: int,
    probed: bool,
    *extra: str,
    site: Path | None = None,
    **knobs: str,
) -> tuple[subprocess.CompletedProcess, dict[str, int]]:
    """One ``lm_eval --model hf`` run on CPU (through ``eval-probe run`` when probed), with
    the probe's ``knobs``; returns it and what transformers generated
    (scripts/lm_eval_hf_counted.py). ``site``: a directory put on PYTHONPATH, which
    ``eval-probe run`` chains."""
    counts = output.with_suffix(".counts.json")
    lm_eval = [
        hf_python(), str(SCRIPTS / "lm_eval_hf_counted.py"), str(counts), "--",
        "--model", "hf", "--model_args", f"pretrained={model},dtype=float32", "--device", "cpu",
        "--tasks", ",".join(str(t) for t in tasks), "--batch_size", str(batch_size),
        "--gen_kwargs", f"max_gen_toks={max_tokens}", "--output_path", str(output), "--log_samples", *extra,
    ]  # fmt: skip
    command = [PYTHON, "-m", "probe", "run", "--result-dir", str(output), "--", *lm_eval] if probed else lm_eval
    env = offline_env(None, **knobs)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run, json.loads(counts.read_text())


def hf_requests(prompts: list[str], task: str = "probe_prompts", **gen_kwargs: Any) -> list[Any]:
    """lm-eval's generate requests for ``prompts`` of ``task``, stopping at "Question:" (more
    settings in ``gen_kwargs``)."""
    from lm_eval.api.instance import Instance

    settings = {"until": ["Question:"], "temperature": 0, **gen_kwargs}
    return [Instance("generate_until", {}, (p, settings), i, metadata=(task, i, 1)) for i, p in enumerate(prompts)]


def echo_hflm(factory: pytest.TempPathFactory) -> Any:
    """lm-eval's ``HFLM`` on CPU over the echo tiny Llama."""
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(tiny_llama("echo", factory)), device="cpu", dtype="float32", batch_size=1)


def in_batch_order(ends: str, batch: int, body: str = "p") -> list[str]:
    """Distinct prompts, the k-th ending with ``ends[k]``, that the probe generates in this
    order with ``batch`` rows a batch: lm-eval sorts them longest first, so the k-th run of
    ``batch`` (in falling lengths of its own) is one of its batches, and the probe runs its
    batches in the order of their first prompts' seeded hash (probe.runtime.inprocess.order.batch_order)."""
    from probe.runtime.core.sampling import DEFAULT_SEED, rank

    def key(prompt: str) -> int:
        return rank(DEFAULT_SEED, repr(prompt))

    chunks = [ends[i : i + batch] for i in range(0, len(ends), batch)]
    chosen: list[str] = []
    last = -1
    for j, chunk in enumerate(chunks):  # chunk j: lengths below chunk j-1's, the last the shortest
        top = (len(chunks) - j) * batch
        first = min((f"{body * top}{n:03d}{chunk[0]}" for n in range(1000)), key=lambda p: (key(p) <= last, key(p)))
        last = key(first)
        chosen += [first] + [f"{body * (top - i)}000{end}" for i, end in enumerate(chunk[1:], 1)]
    return chosen
