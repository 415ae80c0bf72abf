"""The in-process engine's slow start (``engine_slow_start``), on a simulated engine loop:
``LLM.generate`` offers every request, then steps while anything is unfinished; each step ends
some of the requests in the engine, each at the cap or not, and may trip a group. The real
engine's path is tests/test_vllm_offline.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.runtime.core.contract import Settings
from probe.runtime.scope.groups import Group
from probe.runtime.vllm.engine_slow_start import AddFailed, EngineSlowStart

AT_CAP, STOPPED = "length", "stop"
MIN_SAMPLES = Settings().min_samples
ON = Settings(slow_start="on")  # at any width (under auto, up to 64)


def offered(slow: EngineSlowStart, places: list[tuple[int, Group]], sent: list[int]) -> None:
    """Offer each (place, group) as LLM.generate adds them; ``sent`` gets the places sent."""
    for place, group in places:
        if slow.offer(place, group, lambda place=place: sent.append(place)):
            sent.append(place)


def run(n: int, width: int, groups: int, endings: list[tuple[int, bool, int]]) -> tuple[list[int], set[int], dict]:
    """Offer ``n`` requests, dealt to ``groups`` groups in turn, then step until the engine is
    empty. ``endings``: per step, how many requests end, whether at the cap, and which group
    trips then (-1: none). Returns the places in the order sent, the places never sent, and
    the group of each place."""
    slow = EngineSlowStart.for_engine(ON, width, True)
    assert slow is not None
    made = [Group(str(g), {}) for g in range(groups)]
    group_of = {place: made[place % groups] for place in range(n)}
    sent: list[int] = []
    offered(slow, list(group_of.items()), sent)
    done, steps = 0, 0
    while done < len(sent):
        steps += 1
        assert steps < 10 * n + 10, "the engine loop never ended"
        ends, at_cap, trips = endings[steps % len(endings)] if endings else (1, True, -1)
        for place in sent[done : done + max(ends, 1)]:
            done += 1
            slow.finished(group_of[place], [AT_CAP if at_cap else STOPPED])
        if 0 <= trips < groups:
            made[trips].tripped = True
        busy = done < len(sent)
        slow.admit(lambda busy=busy: busy)
        # Liveness: the loop never ends while a request is held.
        assert done < len(sent) or not slow.waiting
    return sent, slow.never_sent, group_of


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 120),
    width=st.integers(1, 128),
    groups=st.integers(1, 3),
    endings=st.lists(st.tuples(st.integers(0, 9), st.booleans(), st.integers(-3, 2)), max_size=30),
)
def test_every_request_is_sent_or_blanked_once_in_its_groups_order_and_the_loop_ends(n, width, groups, endings) -> None:
    sent, never_sent, group_of = run(n, width, groups, endings)
    assert sorted(sent + sorted(never_sent)) == list(range(n))  # each exactly once
    for group in {id(g): g for g in group_of.values()}.values():
        mine = [place for place in sent if group_of[place] is group]
        assert mine == sorted(mine)  # the seeded sample order lm-eval's prompts arrived in
    assert all(group_of[place].tripped for place in never_sent)  # only a trip leaves one unsent


@given(n=st.integers(MIN_SAMPLES + 1, 300), width=st.integers(1, 256), groups=st.integers(1, 4))
@settings(max_examples=100, deadline=None)
def test_each_group_of_a_never_stopping_model_reaches_the_engine_with_min_samples(n, width, groups) -> None:
    # Several groups in one call (two tasks): each has its own budget, so each can gather its
    # MIN_SAMPLES observations (one budget for the call would spread them over the groups).
    slow = EngineSlowStart.for_engine(ON, width, True)
    assert slow is not None
    made = [Group(str(g), {}) for g in range(groups)]
    group_of = {place: made[place % groups] for place in range(n * groups)}
    sent: list[int] = []
    offered(slow, list(group_of.items()), sent)
    assert all(sum(group_of[p] is g for p in sent) == MIN_SAMPLES for g in made)
    first_wave = list(sent)
    for i, place in enumerate(first_wave):  # every generation at the cap; a group trips at its MIN_SAMPLES-th
        group = group_of[place]
        slow.finished(group, [AT_CAP])
        group.tripped = sum(group_of[p] is group for p in first_wave[: i + 1]) == MIN_SAMPLES
        slow.admit(lambda i=i: i + 1 < len(first_wave))
    assert len(sent) == MIN_SAMPLES * groups and not slow.waiting
    assert slow.never_sent == set(group_of) - set(sent)


def test_requests_that_are_not_evidence_are_never_held() -> None:
    # A task whose max_gen_toks is below MIN_MAX_TOKENS beside one whose is not: the rule never
    # reads the first's answers, so nothing of it waits for evidence.
    slow = EngineSlowStart.for_engine(ON, 8, True)
    assert slow is not None
    short = Group("short", {})
    assert all(slow.offer(place, short, lambda: None, evidence=False) for place in range(3 * MIN_SAMPLES))
    assert not slow.waiting and short.engine_slow_start is None


def test_a_groups_budget_spans_its_calls() -> None:
    # --batch_size N: one LLM.generate call per chunk of a group; the second chunk's call
    # sends only what the group's budget has left after the first.
    group = Group("g", {})
    first, second = (EngineSlowStart.for_engine(ON, 48, True) for _ in range(2))
    assert first is not None and second is not None
    sent: list[int] = []
    offered(first, [(place, group) for place in range(10)], sent)
    for _ in range(10):
        first.finished(group, [AT_CAP])
    offered(second, [(place, group) for place in range(10, 20)], sent)
    assert sent == list(range(MIN_SAMPLES))


def test_a_healthy_model_opens_the_engine_by_per_stop_for_each_stop() -> None:
    group = Group("g", {})
    slow = EngineSlowStart.for_engine(Settings(), 64, True)
    assert slow is not None
    sent: list[int] = []
    offered(slow, [(place, group) for place in range(200)], sent)
    per_stop = group.engine_slow_start.per_stop  # type: ignore[union-attr]
    assert len(sent) == MIN_SAMPLES and per_stop == 64
    slow.finished(group, [STOPPED])
    slow.admit(lambda: True)
    assert len(sent) == MIN_SAMPLES + per_stop


def test_an_error_from_a_held_add_propagates_and_the_rest_stay_held() -> None:
    # LLM.generate would have raised it while adding; held, it comes out of the engine step.
    group = Group("g", {})
    slow = EngineSlowStart.for_engine(ON, 8, True)
    assert slow is not None
    for place in range(MIN_SAMPLES):
        assert slow.offer(place, group, lambda: None)

    def refused() -> None:
        raise ValueError("the prompt is longer than the model's context")

    slow.offer(MIN_SAMPLES, group, refused)
    slow.offer(MIN_SAMPLES + 1, group, lambda: None)
    with pytest.raises(AddFailed) as failed:
        slow.admit(lambda: False)  # the engine is empty: it opens
    assert isinstance(failed.value.__cause__, ValueError) and "longer than" in str(failed.value.__cause__)
    assert slow.waiting == {MIN_SAMPLES + 1}


def test_release_all_sends_every_held_request_but_a_tripped_groups() -> None:
    # The guard for the probe's own error in admit: nothing may stay held.
    healthy, tripped = Group("a", {}), Group("b", {})
    slow = EngineSlowStart.for_engine(ON, 8, True)
    assert slow is not None
    sent: list[int] = []
    offered(slow, [(place, healthy if place % 2 else tripped) for place in range(3 * MIN_SAMPLES)], sent)
    tripped.tripped = True
    slow.release_all()
    assert not slow.waiting and sorted(sent) == [p for p in range(3 * MIN_SAMPLES) if p % 2 or p < 2 * MIN_SAMPLES]
    assert slow.never_sent == {p for p in range(2 * MIN_SAMPLES, 3 * MIN_SAMPLES) if not p % 2}


def test_the_knob_and_the_engine_width_decide_whether_it_applies() -> None:
    auto, on, off = Settings(), Settings(slow_start="on"), Settings(slow_start="off")
    assert EngineSlowStart.for_engine(auto, 64, True) is not None
    assert EngineSlowStart.for_engine(auto, 256, True) is None  # vLLM's default width: as the gate at C=256
    assert EngineSlowStart.for_engine(on, 256, True) is not None
    assert EngineSlowStart.for_engine(off, 8, True) is None
    assert EngineSlowStart.for_engine(auto, 8, False) is None  # nothing there can be evidence
    assert EngineSlowStart.for_engine(auto, None, True) is None  # a width nobody knows: wide
    assert EngineSlowStart.for_engine(on, "x", True) is not None
