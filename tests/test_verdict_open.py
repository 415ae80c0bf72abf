"""Streaming while the verdict is open (``HYPERLOOM_EVAL_PROBE_STREAM=auto``): the rule's
property, exhaustively, then real lm-eval against the simulated server: a healthy run stops
streaming after its first observations, a model looping on most prompts still trips on what
its streams show, and a model that turns bad mid-run is streamed again once the share climbs."""

from __future__ import annotations

import json

import pytest
from support.lm import GEN_KWARGS, completions, generate, probe_installed, settled
from support.probed import loop_until_flagged, probe_with_requests, response

from probe.runtime import contract, rule

RATIOS = (1e-6, 0.05, 0.1, 0.3, 0.5, 0.75, 0.9, 1.0)


@pytest.mark.release_independent
@pytest.mark.parametrize("min_samples", [1, 2, 5, 16])
@pytest.mark.parametrize("ratio", RATIOS)
def test_a_closed_verdict_cannot_fire_on_its_next_observation(min_samples: int, ratio: float) -> None:
    for observed in range(0, 121):
        for pathological in range(0, observed + 1):
            is_open = rule.verdict_open(observed, pathological, min_samples, ratio)
            if rule.rule_fires(observed, pathological, min_samples, ratio):
                assert is_open, (observed, pathological)
            if not is_open:
                # Whatever the next observation shows, the rule does not fire on it.
                assert not rule.rule_fires(observed + 1, pathological + 1, min_samples, ratio)
                assert not rule.rule_fires(observed + 1, pathological, min_samples, ratio)


@pytest.mark.release_independent
@pytest.mark.parametrize("min_samples", [1, 16, 40])
@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("pending", [1, 3, 10, 64])
def test_a_closed_verdict_cannot_fire_whatever_its_pending_generations_show(
    min_samples: int, ratio: float, pending: int
) -> None:
    # A loop in flight shows late: unstreamed, at the cap; streamed, once the detector has read
    # enough of it, after the healthy answers beside it have ended. Each pending generation is
    # judged as if it were one, so that a closed verdict stays closed only while even all of
    # them, and one more, could not fire the rule.
    for observed in range(0, 121):
        for pathological in range(0, observed + 1):
            if rule.verdict_open(observed, pathological, min_samples, ratio, pending):
                continue
            for shown in range(pending + 1):
                settled = observed + pending + 1, pathological + shown + 1
                assert not rule.rule_fires(*settled, min_samples, ratio), (observed, pathological, shown)
    # More pending generations never close an open verdict.
    for observed in range(16, 121, 7):
        for pathological in range(0, observed + 1, 3):
            for fewer in range(pending):
                if rule.verdict_open(observed, pathological, min_samples, ratio, fewer):
                    assert rule.verdict_open(observed, pathological, min_samples, ratio, pending)


@pytest.mark.release_independent
@pytest.mark.parametrize("min_samples", [1, 2, 5, 16])
@pytest.mark.parametrize("ratio", RATIOS)
def test_every_path_from_closed_to_a_trip_reopens_the_verdict_first(min_samples: int, ratio: float) -> None:
    # The worst path for a closed verdict: every further observation pathological. The state
    # just before the rule fires is open, and so is every state from where the share reaches
    # REACH of the ratio: streaming resumes before the trip, never only at it.
    for observed in range(min_samples, 81):
        for pathological in range(0, observed + 1):
            if rule.verdict_open(observed, pathological, min_samples, ratio):
                continue
            o, p = observed, pathological
            # (At a ratio of 1 a single healthy observation means the rule can never fire.)
            while not rule.rule_fires(o + 1, p + 1, min_samples, ratio) and o < 10 * observed:
                o, p = o + 1, p + 1
                if p >= rule.REACH * ratio * o:
                    assert rule.verdict_open(o, p, min_samples, ratio), (observed, pathological, o, p)
            if rule.rule_fires(o + 1, p + 1, min_samples, ratio):
                assert rule.verdict_open(o, p, min_samples, ratio)


@pytest.mark.release_independent
@pytest.mark.parametrize("min_samples", [1, 2, 5, 16, 40])
@pytest.mark.parametrize("ratio", RATIOS)
def test_no_verdict_closes_on_fewer_than_close_after_observations(min_samples: int, ratio: float) -> None:
    # A single early stop is a share of 0: too few to stop reading the loops sent beside it.
    for observed in range(max(min_samples, rule.CLOSE_AFTER)):
        assert all(rule.verdict_open(observed, p, min_samples, ratio) for p in range(observed + 1))


@pytest.mark.release_independent
@pytest.mark.parametrize("ratio", [0.5, 0.75, 0.9])
def test_a_healthy_share_closes_the_verdict_once_min_samples_are_observed(ratio: float) -> None:
    assert all(rule.verdict_open(observed, 0, 16, ratio) for observed in range(16))
    assert not any(rule.verdict_open(observed, 0, 16, ratio) for observed in range(16, 2000))
    # A healthy run's share of answers at the cap (0.2 here) below REACH of the ratio: closed.
    assert not rule.verdict_open(1000, 200, 16, 0.75)
    assert rule.verdict_open(1000, 380, 16, 0.75)


def _run(server, result_dir, n: int, concurrency: int, max_tokens: int = 4096) -> tuple[dict, dict | None]:
    with probe_installed() as probe:
        generate(completions(server.base_url, num_concurrent=concurrency), n, {**GEN_KWARGS, "max_tokens": max_tokens})
        probe.finalise()
        document = probe.evidence_document()
    sidecar = result_dir / contract.SIDECAR_NAME
    return settled(server) | {"evidence": document}, json.loads(sidecar.read_text()) if sidecar.exists() else None


def _closes_at(concurrency: int) -> int:
    """The fewest healthy observations that close the verdict with ``concurrency`` pending."""
    return next(o for o in range(10**5) if not rule.verdict_open(o, 0, 16, 0.75, concurrency))


@pytest.mark.parametrize("concurrency", [4, 16, 64])
def test_a_healthy_run_streams_only_its_first_requests(sim, result_dir, concurrency) -> None:
    server = sim("healthy", lengths="lognormal", seconds_per_token=0.00005)
    stats, sidecar = _run(server, result_dir, 240, concurrency)
    assert sidecar is None and stats["generate_requests"] == 240
    # Sent streamed only while fewer than MIN_SAMPLES (16) have been observed, or while the
    # requests in flight, were they all loops, would make REACH of the ratio: at most as many
    # as the verdict takes to close with all of them pending, and those in flight then.
    assert _closes_at(4) == 16 and _closes_at(64) == 107
    assert 16 <= stats["streamed"] <= _closes_at(concurrency) + concurrency < 240
    assert stats["evidence"]["groups"][0]["flagged"] == 0


def test_with_the_knob_on_a_healthy_run_streams_every_request(sim, result_dir, monkeypatch) -> None:
    monkeypatch.setenv(contract.ENV_STREAM, "on")
    server = sim("healthy", lengths="lognormal", seconds_per_token=0.00005)
    stats, sidecar = _run(server, result_dir, 48, 8)
    assert sidecar is None and stats["streamed"] == stats["generate_requests"] == 48


@pytest.mark.parametrize(
    ("concurrency", "min_samples", "n", "max_tokens"),
    [
        (4, 16, 400, 4096),
        (16, 16, 400, 4096),
        (64, 16, 400, 4096),
        # MIN_SAMPLES=1: the slow start sends one request, and its stop (the seeded sample's first
        # prompt is a healthy one here) lets 32 more out at once, which must still be read.
        (16, 1, 200, 8192),
    ],
)
def test_a_model_looping_on_most_prompts_trips_on_what_its_streams_show(
    sim, result_dir, monkeypatch, concurrency, min_samples, n, max_tokens
) -> None:
    # 80% of prompts loop to the cap; the rest are answered at once, so healthy observations
    # come in first, while the loops are still being read.
    monkeypatch.setenv(contract.ENV_MIN_SAMPLES, str(min_samples))
    clock = 8192 / max_tokens * 0.0002  # 1.6 s a loop
    server = sim("mixed", cap_fraction=0.8, cap_loop="loop_short", seconds_per_token=clock)
    stats, sidecar = _run(server, result_dir, n, concurrency, max_tokens)
    assert sidecar is not None and sidecar["verdict"]["cause"] == contract.REPETITION
    # The trip came from flags, before any loop ran to the cap (each took 2 s).
    assert sidecar["verdict"]["flagged"] >= max(1, 0.75 * min_samples - 4)
    assert all(ending != "length" for ending in stats["evidence"]["groups"][0]["finish_reasons"])


def test_a_model_that_turns_bad_mid_run_is_streamed_again_and_trips(sim, result_dir) -> None:
    # Healthy for its first 40 requests, then looping on every prompt: the verdict closes after
    # the first observations, the share climbs with each loop that runs to the cap, and once it
    # reaches REACH of the ratio the requests are streamed again and the loops are flagged.
    server = sim("healthy", turn_after=40, cap_loop="loop_short", seconds_per_token=0.00005)  # 0.2 s a loop
    stats, sidecar = _run(server, result_dir, 400, 8)
    assert sidecar is not None
    group = stats["evidence"]["groups"][0]
    assert group["tripped"] and group["flagged"] > 0
    at_cap = group["finish_reasons"].get("length", 0)
    # Loops sent while the verdict was closed ran to the cap, until, with the 8 in flight, the
    # share reached REACH of the ratio (at_cap + 8 >= 0.375 * (40 + at_cap + 8): 16), and a wave
    # in flight after that.
    assert 0 < at_cap <= 24 + 8
    assert stats["streamed"] > 40


def test_a_whole_wave_of_early_stops_does_not_hide_the_loops_streamed_beside_it(sim, result_dir, monkeypatch) -> None:
    # C=128: no slow start, one wave of 128 streamed at once. Its healthy answers come back at
    # once; its loops are flagged only after seconds (0.05 s a token), and would reach the cap
    # after 200. Had the verdict closed on the stops alone, the loops sent in their places would
    # go unstreamed and the streamed ones alone could not make the ratio: with every generation
    # in flight pending, the verdict stays open, and the trip comes from flags.
    monkeypatch.setenv(contract.ENV_LENGTH_RATIO, "0.5")
    server = sim("mixed", cap_fraction=0.52, cap_loop="loop_short", seconds_per_token=0.05)
    stats, sidecar = _run(server, result_dir, 400, 128)
    assert sidecar is not None and sidecar["verdict"]["cause"] == contract.REPETITION
    group = stats["evidence"]["groups"][0]
    assert "length" not in group["finish_reasons"]  # no loop ran to the cap
    assert stats["tokens_generated"] < 0.2 * 128 * 4096


def test_generations_in_flight_are_pending_until_flagged_or_ended() -> None:
    probe, requests = probe_with_requests(40)
    group = requests[0].group
    for request in requests[:32]:
        assert probe.worth_streaming(request)
    assert group.pending == 32
    for request in requests[:16]:  # 16 healthy stops while 16 more stream
        probe.observe(request, response("stop", 100))
        probe.ended(request)
    # Were the 16 in flight all loops, the share would be 0.5: still open, though no loop showed.
    assert group.pending == 16 and group.tally.observed == 16 and group.tally.pathological == 0
    assert probe.worth_streaming(requests[32])
    loop_until_flagged(probe, requests[16])  # counted once flagged, no longer pending
    assert group.pending == 16 and group.tally.pathological == 1
    probe.observe(requests[16], response("length", 4096))
    probe.ended(requests[16])
    assert group.pending == 16 and group.tally.observed == 17
    for request in requests[17:33]:
        probe.observe(request, response("stop", 100))
        probe.ended(request)
        probe.ended(request)  # twice: counted once
    assert group.pending == 0 and group.tally.observed == 33
    # 1 of 33, nothing in flight: closed, and a request sent now is pending unstreamed.
    assert not probe.worth_streaming(requests[33]) and group.pending == 1
