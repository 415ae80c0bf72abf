"""A small arithmetic task that lm-eval runs offline from a local JSONL file.

The demo, the tests and the benchmarks use it: no dataset download is possible here.
The simulated healthy model answers it correctly, so a healthy run scores 1.0. Pass the
YAML file itself to ``--tasks``, as InferenceX does with its own gsm8k.yaml.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

TASK = "probe_arith"
# A second task, for runs of several tasks: other words and other stop sequences, so lm-eval
# puts its requests in a group of their own. Its prompts carry COUNT_MARKER, which the
# simulated server's ``loop_marker`` can single out.
SECOND_TASK = "probe_count"
COUNT_MARKER = "Count:"
# A third: TASK's questions and stop sequences, its prompts ending in "Answer!" where TASK's
# end in "Answer:" (the tests' tiny echo model answers one and stops, and repeats the other).
EXCLAIM_TASK = "probe_exclaim"
# Variables of the caller's shell that must not leak into a run: the probe's knobs, where
# its sidecar goes, and any PYTHONPATH (which could carry another sitecustomize.py).
_NOT_INHERITED = ("PYTHONPATH", "RESULT_DIR", "EVAL_RESULT_DIR")
# The 0.4.9.2 release's CLI logs each task's YAML path relative to its own tasks folder, and
# fails for a task whose name it does not know; InferenceX's lm-eval (b315ef3, which also calls
# itself 0.4.9.2) fails listing it (0.4.12 and 0.4.13, tested here, are fixed). There the task borrows a
# built-in name, exactly as InferenceX's gsm8k.yaml does.
BORROWED_NAMES = {TASK: "gsm8k", SECOND_TASK: "gsm8k_cot", EXCLAIM_TASK: "gsm8k_cot_zeroshot"}
METRIC = "exact_match,strict-match"

_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
fewshot_split: test
num_fewshot: 0
output_type: generate_until
doc_to_text: "{lead} What is {{{{a}}}} + {{{{b}}}}?\\n{cue}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: {until}
  max_gen_toks: 64
  temperature: 0
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "(-?[0-9]+)"
      - function: take_first
metadata:
  version: 1
"""


@dataclass(frozen=True)
class LocalTask:
    """A written task: pass ``yaml`` to lm-eval's ``--tasks``; results are under ``name``."""

    yaml: Path
    name: str

    def lm_eval_command(
        self,
        base_url: str,
        model: str,
        output: Path,
        max_tokens: int,
        concurrency: int,
        *extra: str,
        model_args: str = "",
        also: tuple[LocalTask, ...] = (),
    ) -> list[str]:
        """``python -m lm_eval`` on this task (and the tasks in ``also``, in the same run)
        against the completions endpoint at ``base_url``.

        ``model_args`` adds to lm-eval's ``--model_args``; ``extra`` goes at the end. Several
        tasks must have been written into one directory that holds no other task YAML (see
        :func:`tasks_arguments`).
        """
        arguments = (
            f"model={model},base_url={base_url}/v1/completions,num_concurrent={concurrency},"
            "tokenized_requests=False,tokenizer_backend=None" + (f",{model_args}" if model_args else "")
        )
        return [
            sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", arguments,
            *tasks_arguments((self, *also)), "--output_path", str(output),
            "--gen_kwargs", f"max_tokens={max_tokens}",
            *extra,
        ]  # fmt: skip

    def lm_eval_vllm_arguments(
        self,
        model: Path,
        output: Path,
        max_tokens: int,
        max_num_seqs: int,
        *extra: str,
        max_model_len: int = 2048,
        gen_kwargs: str = "",
        batch_size: str = "auto",
        also: tuple[LocalTask, ...] = (),
    ) -> list[str]:
        """lm-eval's arguments (after ``python -m lm_eval``) for this task on in-process vLLM.

        The tasks in ``also`` run in the same run. By default every prompt of a group goes in one
        ``LLM.generate`` call (``--batch_size auto``), and vLLM's counters are kept.
        ``max_num_seqs`` bounds the requests vLLM runs at once. ``max_model_len`` must hold a prompt
        and ``max_tokens``. ``gen_kwargs`` adds to lm-eval's ``--gen_kwargs``. ``batch_size`` N
        makes a call per N prompts.
        """
        model_args = (
            f"pretrained={model},dtype=float32,max_model_len={max_model_len},max_num_seqs={max_num_seqs},"
            "enforce_eager=True,disable_log_stats=False"
        )
        sampling = f"max_gen_toks={max_tokens}" + (f",{gen_kwargs}" if gen_kwargs else "")
        return [
            "--model", "vllm", "--model_args", model_args, "--batch_size", batch_size, *tasks_arguments((self, *also)),
            "--output_path", str(output), "--gen_kwargs", sampling, *extra,
        ]  # fmt: skip


def tasks_arguments(tasks: tuple[LocalTask, ...]) -> list[str]:
    """lm-eval's ``--tasks`` for ``tasks``: one YAML file, or for several their one directory, as
    InferenceX passes its tasks. InferenceX's lm-eval (b315ef3) takes ``--tasks a,b`` for one name."""
    if len(tasks) == 1:
        return ["--tasks", str(tasks[0].yaml)]
    folders = {task.yaml.parent for task in tasks}
    if len(folders) != 1:
        raise ValueError(f"several tasks run together must be written into one directory, not {sorted(folders)}")
    (folder,) = folders
    return ["--tasks", str(folder)]


_STYLES = {  # each task's lead, stop sequences and cue
    TASK: ("Question:", '["\\n\\n", "Question:"]', "Answer:"),
    SECOND_TASK: (COUNT_MARKER, '["\\n\\n"]', "Answer:"),
    EXCLAIM_TASK: ("Question:", '["\\n\\n", "Question:"]', "Answer!"),
}


def task_name(task: str = TASK) -> str:
    """The task's name for the installed lm-eval (see BORROWED_NAMES)."""
    try:
        release = tuple(int(part) for part in version("lm_eval").split(".")[:3])
    except (PackageNotFoundError, ValueError):
        return task
    return BORROWED_NAMES[task] if release < (0, 4, 10) else task


def write_task(directory: Path, n_docs: int = 32, task: str = TASK) -> LocalTask:
    """Write ``n_docs`` questions and the YAML of ``task`` (TASK, SECOND_TASK or EXCLAIM_TASK) into
    ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{task}.jsonl"
    with data.open("w", encoding="utf-8") as handle:
        for i in range(n_docs):
            a, b = 3 * i + 1, 7 * i + 2
            handle.write(json.dumps({"a": a, "b": b, "answer": str(a + b)}) + "\n")
    name = task_name(task)
    lead, until, cue = _STYLES[task]
    yaml = directory / f"{task}.yaml"
    yaml.write_text(_YAML.format(task=name, data=data.resolve(), lead=lead, until=until, cue=cue), encoding="utf-8")
    return LocalTask(yaml.resolve(), name)


def offline_env(site: Path | None = None, **extra: str) -> dict[str, str]:
    """The environment for a child process that runs lm-eval on the local task.

    It is offline: nothing is fetched from a hub. The caller's probe knobs, result directory and
    PYTHONPATH are removed. ``site``, a directory holding the probe's sitecustomize.py, becomes the
    PYTHONPATH when given. ``extra`` goes on top.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERLOOM_EVAL_PROBE") and k not in _NOT_INHERITED}
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    if site is not None:
        env["PYTHONPATH"] = str(site)
    env.update(extra)
    return env
