"""The outer gate's slow start: the pure policy, and the asyncio gate that applies it."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from probe.runtime.core import contract
from probe.runtime.core.rule import Sample
from probe.runtime.scope.gate import AUTO_MAX_CONCURRENT, Gate, Gates, SlowStart, slow_start_applies

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent


def _slow(full: int = 64, min_samples: int = 16, ratio: float = 0.75) -> SlowStart:
    return SlowStart.for_batch(full, min_samples, ratio, slow=True)


def _send_all(policy: SlowStart) -> int:
    """Send while the policy allows (nothing in flight); how many were sent."""
    sent = 0
    while policy.may_send(0):
        policy.send()
        sent += 1
    return sent


def test_a_never_stopping_model_gets_exactly_min_samples_requests_sent() -> None:
    policy = _slow()
    assert _send_all(policy) == 16
    for labels in (["length"], ["repetition"], ["usage_at_cap"], ["length", "length"]):
        policy.finished(True, labels, tripped=False, unprobed=False)
    assert _send_all(policy) == 0 and policy.sent == 16


@pytest.mark.parametrize(
    ("label", "more"),
    [("error", 8), ("timeout", 8), ("abort", 8), ("cancelled", 8), ("content_filter", 8), ("other", 8),
     ("max_tokens", 8), ("model_length", 8), ("canceled", 8), ("insufficient_system_resource", 8),
     ("stop", 64), ("usage_below_cap", 64), ("eos_token", 64), ("stop_sequence", 64), ("tool_calls", 64),
     ("end_turn", 64)],
)  # fmt: skip
def test_every_ending_that_is_not_at_the_cap_widens_the_gate(label: str, more: int) -> None:
    """Not only stops: an ending the rule does not count as pathological must widen the gate,
    or a server that answers errors would leave the remaining calls parked for ever. Only the
    model's own stop opens it whole: an error says nothing of the model (2 x 64 / 16 more)."""
    policy = _slow()
    _send_all(policy)
    policy.finished(True, [label], tripped=False, unprobed=False)
    assert _send_all(policy) == more


def test_a_ratio_of_one_never_makes_the_budget_nan() -> None:
    policy = _slow(ratio=1.0)
    _send_all(policy)
    policy.finished(True, ["length"], tripped=False, unprobed=False)  # 0 credits * inf per stop
    policy.finished(True, ["length"], tripped=False, unprobed=False)
    assert policy.allowance == 16
    policy.finished(True, ["stop"], tripped=False, unprobed=False)
    assert policy.may_send(0)


def test_each_stop_lets_per_stop_more_be_sent() -> None:
    policy = _slow()
    _send_all(policy)
    policy.finished(True, ["stop"], tripped=False, unprobed=False)
    assert _send_all(policy) == 64
    policy.finished(True, ["length", "stop", "usage_below_cap", "length"], tripped=False, unprobed=False)
    assert _send_all(policy) == 128  # only the generations of a batched answer not at the cap count


@pytest.mark.parametrize(
    ("full", "ratio", "per_stop"),
    [(64, 0.75, 64.0), (32, 0.75, 32.0), (256, 0.75, 256.0), (2, 0.75, 4.0), (16, 0.95, 20.0), (64, 1.0, math.inf)],
)
def test_per_stop_is_enough_for_the_rule_and_for_full_width(full: int, ratio: float, per_stop: float) -> None:
    assert _slow(full, 16, ratio).per_stop == pytest.approx(per_stop)


@pytest.mark.parametrize(
    ("full", "ratio", "per_ending"),
    [(64, 0.75, 8.0), (32, 0.75, 4.0), (256, 0.75, 32.0), (64, 0.95, 20.0), (64, 0.6, 8.0), (64, 1.0, math.inf)],
)
def test_per_ending_is_enough_for_the_rule(full: int, ratio: float, per_ending: float) -> None:
    assert _slow(full, 16, ratio).per_ending == pytest.approx(per_ending)


@pytest.mark.parametrize(("full", "min_samples"), [(256, 16), (100, 16), (17, 16), (64, 5), (1000, 1)])
def test_a_healthy_model_is_at_full_width_after_its_first_stop(full: int, min_samples: int) -> None:
    policy = _slow(full, min_samples)
    in_flight = _send_all(policy)
    assert in_flight == min_samples
    policy.finished(True, ["stop"], tripped=False, unprobed=False)
    in_flight -= 1
    while policy.may_send(in_flight):
        policy.send()
        in_flight += 1
    assert in_flight == full


@pytest.mark.parametrize("labels", [None, []])
def test_an_answer_that_cannot_be_evidence_counts_like_an_error(labels: list[str] | None) -> None:
    policy = _slow()
    _send_all(policy)
    policy.finished(True, labels, tripped=False, unprobed=False)
    assert _send_all(policy) == 8


def test_a_failed_call_gives_its_send_back_for_the_retry() -> None:
    policy = _slow()
    _send_all(policy)
    policy.finished(False, None, tripped=False, unprobed=False)
    assert _send_all(policy) == 1


def test_a_trip_never_lets_more_be_sent() -> None:
    policy = _slow()
    _send_all(policy)
    policy.finished(True, ["stop"], tripped=True, unprobed=False)
    policy.finished(True, ["stop"], tripped=False, unprobed=False)
    policy.finished(False, None, tripped=False, unprobed=False)
    assert policy.allowance == 16 and policy.sent == 16 and not policy.may_send(0)


def test_a_trip_that_could_not_be_applied_opens_it() -> None:
    policy = _slow()
    _send_all(policy)
    policy.finished(True, ["length"], tripped=False, unprobed=True)
    assert policy.may_send(63) and not policy.may_send(64)


@pytest.mark.parametrize("ratio", [0.5, 0.6, 0.75, 0.9])
@pytest.mark.parametrize("p_cap", [0.0, 0.3, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0])
def test_the_gate_runs_dry_only_once_the_rule_has_fired(ratio: float, p_cap: float) -> None:
    """Answers in any order, any share at the cap: every request is sent unless the rule fired."""
    settings = contract.Settings(length_ratio=ratio)
    for seed in range(20):
        randomly = random.Random(seed)
        policy = SlowStart.for_batch(64, settings.min_samples, ratio, slow=True)
        sample = Sample(settings.min_samples, ratio)
        waiting, running, fired = 300, [], False
        while (waiting or running) and not fired:
            while waiting and policy.may_send(len(running)):
                policy.send()
                place = 300 - waiting
                sample.join(place, 1)
                waiting -= 1
                running.append((place, "length" if randomly.random() < p_cap else "stop"))
            if not running:
                break  # ran dry
            place, label = running.pop(randomly.randrange(len(running)))
            sample.record(place, 0, label == "length")
            fired = sample.fires()
            settled = sample.complete and not fired
            policy.finished(True, [label], tripped=fired, unprobed=False, settled=settled)
        assert fired or waiting == 0, (seed, sample.as_dict())


def test_when_off_only_num_concurrent_limits_it() -> None:
    policy = SlowStart.for_batch(64, 16, 0.75, slow=False)
    assert policy.allowance == math.inf and policy.may_send(63) and not policy.may_send(64)


@pytest.mark.parametrize("full", [16, 8])
def test_at_or_below_min_samples_a_cap_never_frees_a_send_but_a_stop_always_does(full: int) -> None:
    never_stops, healthy = _slow(full), _slow(full)
    assert _send_all(never_stops) == 16  # sends in all (places are not counted here)
    for _ in range(16):
        never_stops.finished(True, ["length"], tripped=False, unprobed=False)
    assert _send_all(never_stops) == 0
    in_flight = 0
    for _ in range(200):  # answers one at a time: never short of a send while a place is free
        while healthy.may_send(in_flight):
            healthy.send()
            in_flight += 1
        assert in_flight == full
        healthy.finished(True, ["stop"], tripped=False, unprobed=False)
        in_flight -= 1


@pytest.mark.parametrize(
    ("mode", "concurrency", "applies"),
    [
        ("auto", 16, True),
        ("auto", AUTO_MAX_CONCURRENT, True),
        ("auto", AUTO_MAX_CONCURRENT + 1, False),
        ("auto", 256, False),
        ("on", 256, True),
        ("off", 64, False),
    ],
)
def test_the_knob_decides_where_it_applies(mode: str, concurrency: int, applies: bool) -> None:
    assert slow_start_applies(mode, concurrency) is applies


@pytest.mark.parametrize(
    ("raw", "mode"), [("auto", "auto"), (" AUTO ", "auto"), ("", "auto"), ("on", "on"), ("1", "on"), ("off", "off")]
)
def test_slow_start_knob_values(raw: str, mode: str) -> None:
    settings, warnings = contract.read_settings({contract.ENV_SLOW_START: raw})
    assert (settings.slow_start, warnings) == (mode, [])


def test_slow_start_knob_is_part_of_the_contract() -> None:
    default = contract.Settings()
    assert default.as_dict()[contract.ENV_SLOW_START] == "auto"
    fingerprints = {contract.settings_fingerprint(contract.Settings(slow_start=m)) for m in contract.SLOW_START_MODES}
    assert len(fingerprints) == 3


class _Model:
    def __init__(self, concurrent: int) -> None:
        self._concurrent = concurrent


def test_gates_start_slow_only_where_the_knob_and_the_evidence_say() -> None:
    async def budget(mode: str, concurrent: int, can_be_evidence: bool = True) -> float:
        gate = Gates(contract.Settings(slow_start=mode)).for_running_loop(_Model(concurrent), can_be_evidence)
        assert gate is not None
        return gate.policy.allowance

    assert asyncio.run(budget("auto", 64)) == 16
    assert asyncio.run(budget("auto", 8)) == 16
    assert asyncio.run(budget("auto", 256)) == math.inf
    assert asyncio.run(budget("on", 256)) == 16
    assert asyncio.run(budget("off", 64)) == math.inf
    assert asyncio.run(budget("on", 64, can_be_evidence=False)) == math.inf


async def _hold(gate: Gate, name: str, admitted: list[str], release: asyncio.Event) -> None:
    await gate.acquire()
    admitted.append(name)
    await release.wait()


def _tasks(gate: Gate, n: int, admitted: list[str], release: asyncio.Event) -> list[asyncio.Task]:
    return [asyncio.create_task(_hold(gate, str(i), admitted, release)) for i in range(n)]


async def _settle() -> None:
    """Let the loop run until the gate has chosen and the chosen calls have resumed."""
    for _ in range(6):
        await asyncio.sleep(0)


async def test_calls_go_through_in_the_order_they_arrive_as_the_slow_start_allows() -> None:
    gate = Gate(SlowStart(16, 4.0, 8.0))  # 4 first, 8 more per stop, 16 at once
    admitted: list[str] = []
    release = asyncio.Event()
    tasks = _tasks(gate, 30, admitted, release)
    await _settle()
    assert admitted == ["0", "1", "2", "3"] and gate.in_flight == 4
    gate.release(True, ["length"])
    await _settle()
    assert len(admitted) == 4 and gate.in_flight == 3
    gate.release(True, ["stop"])
    await _settle()
    assert admitted == [str(i) for i in range(12)] and gate.in_flight == 10
    for _ in range(2):
        gate.release(True, ["stop"])
    await _settle()
    assert len(admitted) == 20 and gate.in_flight == 16  # every place taken
    gate.release(True, ["stop"], settled=True)  # the sample settled: the gate opens
    await _settle()
    assert admitted == [str(i) for i in range(21)] and gate.in_flight == 16
    for _ in range(9):
        gate.release(True, ["stop"])
    await _settle()
    assert admitted == [str(i) for i in range(30)] and gate.in_flight == 16
    release.set()
    await asyncio.gather(*tasks)


async def test_after_a_trip_every_waiting_call_is_let_through_without_counting() -> None:
    gate = Gate(SlowStart(8, 2.0, 8.0))
    admitted: list[str] = []
    release = asyncio.Event()
    tasks = _tasks(gate, 40, admitted, release)
    await _settle()
    gate.release(True, ["length"], tripped=True)
    await _settle()
    assert len(admitted) == 40 and gate.policy.sent == 2
    release.set()
    await asyncio.gather(*tasks)


async def test_a_call_cancelled_at_the_gate_never_counts() -> None:
    gate = Gate(SlowStart(4, 1.0, 8.0))  # one first, then 8 per stop
    admitted: list[str] = []
    release = asyncio.Event()
    calls = {n: asyncio.create_task(_hold(gate, n, admitted, release)) for n in ("a", "b", "c")}
    await _settle()
    (first,) = admitted
    parked, last = (calls[n] for n in calls if n != first)
    parked.cancel()
    gate.release(True, ["stop"])
    await _settle()
    assert parked.cancelled() and len(admitted) == 2 and gate.policy.sent == 2
    release.set()
    await asyncio.gather(calls[first], last)


async def test_a_place_handed_over_as_the_call_is_cancelled_is_passed_on() -> None:
    gate = Gate(SlowStart(4, 1.0, 8.0))
    admitted: list[str] = []
    release = asyncio.Event()
    await gate.acquire()
    parked = asyncio.create_task(_hold(gate, "parked", admitted, release))
    await _settle()
    gate.release(True, ["stop"])  # lets the parked call through...
    parked.cancel()  # ...which is cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await parked
    assert (gate.in_flight, gate.policy.sent, admitted) == (0, 1, [])
    await asyncio.wait_for(gate.acquire(), 1)
    assert gate.in_flight == 1
