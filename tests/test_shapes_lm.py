"""Healthy answers that repeat a block, as real ones do, never trip a run (issue 34), with real
lm-eval against the simulated server: a reasoning model that restates the function it drafted
(its reasoning streamed apart, or inline before ``</think>``), a chorus sung three times, JSON
records, a table's repeated cells. Every answer stops on its own; at any concurrency and stream
setting the probed answers are the unprobed ones and nothing trips."""

from __future__ import annotations

from typing import Any

import pytest
from support.lm import chat, completions, generate, probe_installed

from probe.runtime.core import contract

# (shape, chat, the share of answers of that shape). JSON records: a fifth of the answers, as in
# the run that was blanked (hostile round 33: 17% of a model's answers flagged, tripped at C>64).
# And every answer JSON records (hostile round 47: 16 records an answer were certain loops).
SHAPES = [("restated", True, 1.0), ("restated", False, 1.0), ("chorus", False, 1.0), ("json", False, 0.2),
          ("json", False, 1.0), ("table", True, 1.0)]  # fmt: skip


@pytest.mark.parametrize(("shape", "chat_format", "share"), SHAPES)
@pytest.mark.parametrize(("concurrency", "stream"), [(16, "auto"), (128, "auto"), (256, "on")])
def test_healthy_answers_that_repeat_a_block_never_trip(
    sim, result_dir, monkeypatch, shape: str, chat_format: bool, share: float, concurrency: int, stream: str
) -> None:
    monkeypatch.setenv(contract.ENV_STREAM, stream)
    server = sim("healthy", shape=shape, shape_fraction=share, lengths="lognormal", seconds_per_token=0.0002)

    def lm() -> Any:
        if chat_format:
            return chat(server.base_url, concurrency)
        return completions(server.base_url, num_concurrent=concurrency)

    n = 2 * concurrency if concurrency < 256 else 300
    plain = generate(lm(), n, chat_format=chat_format)
    with probe_installed() as probe:
        probed = generate(lm(), n, chat_format=chat_format)
        probe.finalise()
        (group,) = probe.evidence_document()["groups"]
    assert probed == plain
    assert not group["tripped"] and not (result_dir / contract.SIDECAR_NAME).exists()
    assert group["flagged"] == 0  # every flag raised was withdrawn as its answer stopped (false_flags)
    assert server.snapshot()["streamed"] >= (n if stream == "on" else 11)
