"""Streaming only what the verdict needs (``HYPERLOOM_EVAL_PROBE_STREAM=auto``), with real lm-eval
against the simulated server: a healthy run streams its sample and nothing more, a model looping
on most prompts still trips on what its streams show, before any loop reaches the cap."""

from __future__ import annotations

import json

import pytest
from support.lm import GEN_KWARGS, completions, generate, probe_installed, settled
from support.probed import loop_until_flagged, probe_with_requests, response

from probe.runtime.core import contract


def _run(server, result_dir, n: int, concurrency: int, max_tokens: int = 4096) -> tuple[dict, dict | None]:
    with probe_installed() as probe:
        generate(completions(server.base_url, num_concurrent=concurrency), n, {**GEN_KWARGS, "max_tokens": max_tokens})
        probe.finalise()
        document = probe.evidence_document()
    sidecar = result_dir / contract.SIDECAR_NAME
    return settled(server) | {"evidence": document}, json.loads(sidecar.read_text()) if sidecar.exists() else None


@pytest.mark.parametrize("concurrency", [4, 16, 64, 128])
def test_a_healthy_run_streams_its_sample_and_nothing_more(sim, result_dir, concurrency) -> None:
    server = sim("healthy", lengths="lognormal", seconds_per_token=0.00005)
    stats, sidecar = _run(server, result_dir, 240, concurrency)
    assert sidecar is None and stats["generate_requests"] == 240
    (group,) = stats["evidence"]["groups"]
    assert group["sample"]["complete"] and group["sample"]["generations"] == 16
    # Streamed until 11 of the 16 had stopped (the rest could no longer trip it), 16 at most.
    assert 11 <= stats["streamed"] <= 16 and group["flagged"] == 0


def test_with_the_knob_on_a_healthy_run_streams_every_request(sim, result_dir, monkeypatch) -> None:
    monkeypatch.setenv(contract.ENV_STREAM, "on")
    server = sim("healthy", lengths="lognormal", seconds_per_token=0.00005)
    stats, sidecar = _run(server, result_dir, 48, 8)
    assert sidecar is None and stats["streamed"] == stats["generate_requests"] == 48


@pytest.mark.parametrize(("concurrency", "n"), [(4, 400), (16, 400), (64, 400), (128, 400)])
def test_a_model_looping_on_most_prompts_trips_on_what_its_streams_show(sim, result_dir, concurrency, n) -> None:
    # 80% of prompts loop to the cap; the rest are answered at once, so healthy observations
    # come in first, while the loops are still being read.
    server = sim("mixed", cap_fraction=0.8, cap_loop="loop_short", seconds_per_token=0.0004)  # 1.6 s a loop
    stats, sidecar = _run(server, result_dir, n, concurrency)
    assert sidecar is not None and sidecar["verdict"]["cause"] == contract.REPETITION
    # The trip came from flags, before any loop ran to the cap.
    assert sidecar["verdict"]["flagged"] >= 8
    assert all(ending != "length" for ending in stats["evidence"]["groups"][0]["finish_reasons"])


def test_a_whole_wave_of_early_stops_does_not_hide_the_loops_streamed_beside_it(sim, result_dir, monkeypatch) -> None:
    # C=128, half the prompts loop (0.05 s a token: a loop reaches the cap after 200 s), the rest
    # stop at once. The sample's stops come back first; its loops are flagged after seconds; the
    # rule counts what is not known yet as healthy, and still trips from flags.
    monkeypatch.setenv(contract.ENV_LENGTH_RATIO, "0.5")
    server = sim("mixed", cap_fraction=0.52, cap_loop="loop_short", seconds_per_token=0.05)
    stats, sidecar = _run(server, result_dir, 400, 128)
    assert sidecar is not None and sidecar["verdict"]["cause"] == contract.REPETITION
    group = stats["evidence"]["groups"][0]
    assert "length" not in group["finish_reasons"]  # no loop ran to the cap
    assert stats["tokens_generated"] < 0.2 * 128 * 4096


def test_a_request_is_streamed_while_the_sample_may_need_it() -> None:
    probe, requests = probe_with_requests(100)
    group = requests[0].group
    # The sample (16) is streamed; the reserve (64) only once what is known leans pathological.
    assert all(probe.worth_streaming(r) for r in requests[:16])
    assert not any(probe.worth_streaming(r) for r in requests[16:])
    loop_until_flagged(probe, requests[0])
    assert probe.worth_streaming(requests[16]) and not probe.worth_streaming(requests[64])
    for request in requests[1:16]:
        probe.observe(request, response("stop", 100))
    # 1 of 16 pathological, every outcome known: the verdict is final, nothing more is streamed.
    assert group.sample.final and not any(probe.worth_streaming(r) for r in requests)
