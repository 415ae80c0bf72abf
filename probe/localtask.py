"""A small arithmetic task that lm-eval runs offline from a local JSONL file.

The demo, the tests and the benchmarks use it: no dataset download is possible here.
The simulated healthy model answers it correctly, so a healthy run scores 1.0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TASK = "probe_arith"
METRIC = "exact_match,strict-match"

_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: generate_until
doc_to_text: "Question: What is {{{{a}}}} + {{{{b}}}}?\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n\\n", "Question:"]
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
    """Where a written task lives: pass ``include_path`` to ``--include_path``."""

    include_path: Path
    name: str = TASK
    metric: str = METRIC


def write_task(directory: Path, n_docs: int = 32) -> LocalTask:
    """Write ``n_docs`` questions and the task YAML into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / f"{TASK}.jsonl"
    with data.open("w", encoding="utf-8") as handle:
        for i in range(n_docs):
            a, b = 3 * i + 1, 7 * i + 2
            handle.write(json.dumps({"a": a, "b": b, "answer": str(a + b)}) + "\n")
    (directory / f"{TASK}.yaml").write_text(_YAML.format(task=TASK, data=data.resolve()), encoding="utf-8")
    return LocalTask(directory)
