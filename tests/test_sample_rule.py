"""The rule judges a sample, whatever order lm-eval sends requests in and outcomes arrive in.

Properties of ``rule.Sample`` (hypothesis), its trip-probability table (``trip_probability``,
checked by simulation with adversarial arrival orders), and the hostile case with lm-eval's own
``Collator``: a fifth of the answers run to the cap, all of them on the longest prompts.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lm_eval.models.utils import Collator

from probe.runtime.core.rule import Sample, rule_fires, sample_sizes, trip_probability
from probe.runtime.inprocess.order import sample_members, sampled_collator, sampled_order

pytestmark = pytest.mark.release_independent

SAMPLED = sampled_collator(Collator)


def _joined(n: int) -> Sample:
    """A sample at the defaults of a group of ``n`` one-generation requests, every one made."""
    sample = Sample(16, 0.75)
    sample.expect(n)
    for place in range(n):
        sample.join(place, 1)
    return sample


def _shuffled(n: int, seed: int) -> list[int]:
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def _final(outcomes: list[bool], size: int) -> bool:
    """The rule on the first ``size`` places once every outcome is known."""
    judged = outcomes[:size]
    return rule_fires(len(judged), sum(judged), 16, 0.75)


@settings(max_examples=300, deadline=None)
@given(
    outcomes=st.lists(st.booleans(), min_size=16, max_size=120),
    seed=st.integers(0, 10**6),
    flags=st.lists(st.integers(0, 119), max_size=40),
)
def test_the_rule_fires_only_where_the_completed_sample_fires_whatever_the_arrival_order(
    outcomes: list[bool], seed: int, flags: list[int]
) -> None:
    """Outcomes arrive in any order, and healthy generations may be flagged before they end (a
    provisional flag, never a known outcome). Whenever the rule fires, the sample of that size
    fires once every outcome is known: no arrival order and no false flag trips it."""
    sample = _joined(len(outcomes))
    false_flags = [place for place in flags if place < len(outcomes) and not outcomes[place]]
    events = [(place, outcomes[place], False) for place in range(len(outcomes))]
    events += [(place, True, True) for place in false_flags]
    random.Random(seed).shuffle(events)
    events.sort(key=lambda e: not e[2])  # the flags first, as a stream brings them
    for place, outcome, flag in events:
        if flag:
            sample.flag(place, 0)
        else:
            sample.record(place, 0, outcome)
        if sample.fires():
            assert _final(outcomes, sample.size), sample.as_dict()
            break
    else:
        assert sample.complete


@settings(max_examples=200, deadline=None)
@given(outcomes=st.lists(st.booleans(), min_size=16, max_size=200), seed=st.integers(0, 10**6))
def test_a_completed_sample_is_the_sequential_rule_over_its_prefix(outcomes: list[bool], seed: int) -> None:
    """Whatever the arrival order, the final verdict is the one ``trip_probability`` models:
    judge the first size places, grow by ``step`` while the share leans pathological."""
    sample, order = _joined(len(outcomes)), _shuffled(len(outcomes), seed)
    fired = False
    for place in order:
        sample.record(place, 0, outcomes[place])
        fired = fired or sample.fires()
    first, step, limit = sample_sizes(16)
    size, expected = first, False
    while True:
        size = min(size, len(outcomes))
        judged = outcomes[:size]
        if rule_fires(len(judged), sum(judged), 16, 0.75):
            expected = True
            break
        if size >= min(limit, len(outcomes)) or sum(judged) < 0.5 * 0.75 * len(judged) - 1e-9:
            break
        size += step
    assert fired == expected


@pytest.mark.parametrize("p", [0.5, 0.6, 0.7, 0.8])
def test_the_trip_probability_table_holds_when_the_pathological_answers_arrive_first(p: float) -> None:
    """Simulated runs where every pathological outcome arrives before every healthy one (the
    flags first, as a stream brings them): the trip frequency matches the exact table."""
    trials, trips = 3000, 0
    rng = random.Random(int(p * 1000))
    for _ in range(trials):
        outcomes = [rng.random() < p for _ in range(300)]
        sample = _joined(300)
        for place in sorted(range(300), key=lambda i: not outcomes[i]):
            sample.record(place, 0, outcomes[place])
            if sample.fires():
                trips += 1
                break
    expected = trip_probability(p, 16, 0.75)
    spread = 4 * (expected * (1 - expected) / trials) ** 0.5 + 1 / trials
    assert abs(trips / trials - expected) <= spread, (trips / trials, expected)


def test_the_table_is_what_a_healthy_model_risks() -> None:
    assert trip_probability(0.2, 16, 0.75) < 1e-5
    assert trip_probability(0.5, 16, 0.75) < 0.05
    assert trip_probability(1.0, 16, 0.75) == pytest.approx(1.0)
    assert trip_probability(0.9, 16, 0.75) > 0.99


def _sent(requests: list[tuple[str, dict]], seed: int) -> list[tuple[str, dict]]:
    with sampled_order(seed, reserve=sample_sizes(16)[2]):
        collator = SAMPLED(requests, sort_fn=lambda r: (-len(r[0]), r[0]), group_by="gen_kwargs")
    return [request for batch in collator.get_batched(n=1) for request in batch]


def test_a_fifth_at_the_cap_on_the_longest_prompts_never_trips_at_any_seed() -> None:
    """lm-eval's longest-first order would bring the 264 cut-off answers first; the rule judges
    only the sample, so no seed trips, even with every cut-off answer arriving first."""
    kwargs = {"max_tokens": 2048}
    requests = [(f"question {i}: " + "x" * (i * 7 % 1319), kwargs) for i in range(1319)]
    longest = {r[0] for r in sorted(requests, key=lambda r: -len(r[0]))[: 1319 // 5]}
    for seed in range(200):
        sent = _sent(requests, seed)
        sample = _joined(len(sent))
        for place in sorted(range(len(sent)), key=lambda i: sent[i][0] not in longest):
            sample.record(place, 0, sent[place][0] in longest)
            assert not sample.fires(), seed
        assert sample.complete


def test_the_sample_is_the_same_whatever_order_lm_eval_passes_and_the_rest_keeps_lm_evals_order() -> None:
    kwargs = {"max_tokens": 2048}
    requests = [(f"prompt {'.' * i}", kwargs) for i in range(200)]
    shuffled = random.Random(3).sample(requests, len(requests))
    first, again = _sent(requests, 7), _sent(shuffled, 7)
    reserve = sample_sizes(16)[2]
    assert first[:reserve] == again[:reserve]
    rest = first[reserve:]
    assert rest == sorted(rest, key=lambda r: (-len(r[0]), r[0]))  # lm-eval's order


def test_the_sample_is_uniform_in_lm_evals_length_rank() -> None:
    """Over 400 seeds each request is in the sample about equally often (chi-square)."""
    n, reserve, seeds = 40, 8, 400
    counts = [0] * n
    requests = [(f"prompt {'.' * i}", {"max_tokens": 2048}) for i in range(n)]
    for seed in range(seeds):
        for i in sample_members(seed, requests, reserve):
            counts[i] += 1
    expected = seeds * reserve / n
    assert sum((c - expected) ** 2 / expected for c in counts) < 80  # 39 d.o.f.: P ~ 1e-4


@settings(max_examples=300, deadline=None)
@given(outcomes=st.lists(st.booleans(), min_size=16, max_size=100), seed=st.integers(0, 10**6))
def test_a_final_verdict_never_changes_whatever_comes_next(outcomes: list[bool], seed: int) -> None:
    """Once ``final`` (the gate opens, streaming stops), the rule's verdict is what it will be
    when every outcome is known: it fired already, or it never will."""
    sample, order = _joined(len(outcomes)), _shuffled(len(outcomes), seed)
    verdict = None
    for place in order:
        sample.record(place, 0, outcomes[place])
        if verdict is None and sample.final:
            verdict = sample.fires()
        if verdict is not None:
            assert sample.final and sample.fires() == verdict
    assert sample.final
