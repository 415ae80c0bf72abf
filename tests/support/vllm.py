"""What the tests on real vLLM share: its environment's Python, its servers, the answers."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.resultfiles import written_by_lm_eval
from support.tinymodels import tiny_llama

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
# The echo server's longest generation: the tiny Llama holds 8192 positions, and a closed
# stream needs one long enough to be closed mid-way on a busy machine (test_stream_vllm.py).
ECHO_CAP = 8000


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


def serve(variant: str, factory: pytest.TempPathFactory, name: str | None = None, **start: Any) -> Iterator[Any]:
    """A vLLM server on the tiny Llama ``variant`` (served as ``name``, else as the variant),
    started with ``start`` (scripts/vllm_server.py's arguments), stopped when the generator ends."""
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    import vllm_server

    python = vllm_python()
    model, root = tiny_llama(python, variant, factory), factory.mktemp("vllm")
    server = vllm_server.start(model, name or variant, python, log=root / f"vllm-{variant}.log", **start)
    try:
        yield server
    finally:
        vllm_server.stop(server.pid)
