"""What the tests on real vLLM share: its environment's Python, the answers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.resultfiles import written_by_lm_eval

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def vllm_python() -> str:
    """The vLLM environment's Python (LM_EVAL_PROBE_VLLM_PYTHON); fails the test without one."""
    python = os.environ.get("LM_EVAL_PROBE_VLLM_PYTHON")
    if not python or not Path(python).exists():
        pytest.fail("LM_EVAL_PROBE_VLLM_PYTHON must name the vLLM environment's Python (scripts/test.sh sets it)")
    return python


def answers(output: Path, task: str = "") -> list[str]:
    """The first answer of every document in lm-eval's samples file under ``output`` (the one
    of ``task`` when the run had several), by doc_id."""
    (samples,) = written_by_lm_eval(output, f"samples_{task}*.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    rows = [row for row in rows if row.get("filter") == rows[0].get("filter")]  # one row per document
    return [row["resps"][0][0] for row in sorted(rows, key=lambda r: r["doc_id"])]
