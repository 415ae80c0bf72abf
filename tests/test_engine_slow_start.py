"""The in-process engine's slow start (``engine_slow_start``), on a simulated engine loop:
``LLM.generate`` offers every request, then steps while anything is unfinished; each step ends
some of the requests in the engine, each at the cap or not, and may trip the group. The real
engine's path is tests/test_vllm_offline.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.runtime.contract import Settings
from probe.runtime.engine_slow_start import EngineSlowStart

AT_CAP, STOPPED = "length", "stop"
MIN_SAMPLES = Settings().min_samples
ON = Settings(slow_start="on")  # at any width (under auto, up to 64)


def run(n: int, width: int, endings: list[tuple[int, bool, bool]]) -> tuple[list[int], set[int]]:
    """Offer ``n`` requests, then step until the engine is empty. ``endings``: per step, how
    many requests end, whether they ended at the cap, whether the group trips then. Returns
    the places in the order sent, and the places never sent."""
    slow = EngineSlowStart.for_engine(ON, width, True)
    assert slow is not None
    sent: list[int] = []
    in_engine: list[int] = []
    tripped = False

    def adder(place: int):
        return lambda: (sent.append(place), in_engine.append(place))

    for place in range(n):
        if slow.offer(place, adder(place)):
            adder(place)()
    steps = 0
    while in_engine:
        steps += 1
        assert steps < 10 * n + 10, "the engine loop never ended"
        ends, at_cap, trips = endings[steps % len(endings)] if endings else (1, True, False)
        for _ in range(min(max(ends, 1), len(in_engine))):
            in_engine.pop(0)
            slow.finished([AT_CAP if at_cap else STOPPED], tripped, False)
        tripped = tripped or trips
        slow.group_stands(tripped, False)
        slow.admit(lambda: bool(in_engine), lambda place, tripped=tripped: tripped)
        # Liveness: the loop never ends while a request is held.
        assert in_engine or not slow.held
    return sent, slow.never_sent


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 120),
    width=st.integers(1, 128),
    endings=st.lists(st.tuples(st.integers(0, 9), st.booleans(), st.booleans()), max_size=30),
)
def test_every_request_is_sent_or_blanked_in_order_and_the_loop_ends(n, width, endings) -> None:
    sent, never_sent = run(n, width, endings)
    assert sent == sorted(sent)  # the seeded sample order lm-eval's prompts arrived in
    assert sorted(sent + sorted(never_sent)) == list(range(n))  # each exactly once


@given(n=st.integers(MIN_SAMPLES + 1, 300), width=st.integers(1, 256))
@settings(max_examples=100, deadline=None)
def test_a_never_stopping_model_reaches_the_engine_with_min_samples_until_the_trip(n, width) -> None:
    # Every generation at the cap, one a step; the rule fires at MIN_SAMPLES observations.
    slow = EngineSlowStart.for_engine(ON, width, True)
    assert slow is not None
    sent: list[int] = []
    for place in range(n):
        if slow.offer(place, lambda place=place: sent.append(place)):
            sent.append(place)
    assert len(sent) == MIN_SAMPLES
    for observed in range(1, MIN_SAMPLES + 1):
        tripped = observed == MIN_SAMPLES
        slow.finished([AT_CAP], tripped, False)
        slow.admit(lambda observed=observed: observed < MIN_SAMPLES, lambda place, tripped=tripped: tripped)
    assert len(sent) == MIN_SAMPLES and slow.never_sent == set(range(MIN_SAMPLES, n)) and not slow.held


def test_a_healthy_model_opens_the_engine_by_per_stop_for_each_stop() -> None:
    slow = EngineSlowStart.for_engine(Settings(), 64, True)
    assert slow is not None
    sent: list[int] = []
    for place in range(200):
        if slow.offer(place, lambda place=place: sent.append(place)):
            sent.append(place)
    per_stop = slow.policy.per_stop
    assert len(sent) == MIN_SAMPLES and per_stop == 2 * 64 / MIN_SAMPLES
    slow.finished([STOPPED], False, False)
    slow.admit(lambda: True, lambda place: False)
    assert len(sent) == MIN_SAMPLES + per_stop


def test_the_knob_and_the_engine_width_decide_whether_it_applies() -> None:
    auto, on, off = Settings(), Settings(slow_start="on"), Settings(slow_start="off")
    assert EngineSlowStart.for_engine(auto, 64, True) is not None
    assert EngineSlowStart.for_engine(auto, 256, True) is None  # vLLM's default width: as the gate at C=256
    assert EngineSlowStart.for_engine(on, 256, True) is not None
    assert EngineSlowStart.for_engine(off, 8, True) is None
    assert EngineSlowStart.for_engine(auto, 8, False) is None  # nothing there can be evidence
    assert EngineSlowStart.for_engine(auto, None, True) is None  # a width nobody knows: wide
    assert EngineSlowStart.for_engine(on, "x", True) is not None


def test_an_error_from_a_held_add_propagates_and_the_rest_stay_held() -> None:
    # LLM.generate would have raised it while adding; held, it comes out of the engine step.
    slow = EngineSlowStart.for_engine(ON, 8, True)
    assert slow is not None
    for place in range(MIN_SAMPLES):
        assert slow.offer(place, lambda: None)

    def refused() -> None:
        raise ValueError("the prompt is longer than the model's context")

    slow.offer(MIN_SAMPLES, refused)
    slow.offer(MIN_SAMPLES + 1, lambda: None)
    with pytest.raises(ValueError, match="longer than"):
        slow.admit(lambda: False, lambda place: False)  # the engine is empty: it opens
    assert [place for place, _ in slow.held] == [MIN_SAMPLES + 1]
