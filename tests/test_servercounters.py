"""Reading a server's own counters."""

from __future__ import annotations

import pytest

from probe.demo.servercounters import parse_vllm_metrics, server_counters

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

METRICS = """# HELP vllm:generation_tokens_total Number of generation tokens processed.
vllm:generation_tokens_total{engine="0",model_name="m"} 65536.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 0.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 16.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="m"} 48.0
"""


def test_parse_vllm_metrics() -> None:
    assert parse_vllm_metrics(METRICS) == {
        "generation_tokens": 65536.0,
        "finished_stop": 0.0,
        "finished_length": 16.0,
        "finished_abort": 48.0,
    }


def test_simulated_server_stats_and_no_server(sim) -> None:
    server = sim("healthy")
    assert server_counters(server.base_url) == (0, 0)
    server.stop()
    assert server_counters(server.base_url) == (None, None)
