"""The outer gate's slow start: the pure policy, and the asyncio gate that applies it."""

from __future__ import annotations

import asyncio

import pytest

from probe.runtime import contract
from probe.runtime.gate import AUTO_MAX_CONCURRENT, Gate, Gates, SlowStart, slow_start_applies


def test_starts_at_min_samples_and_min_samples_stops_open_it_fully() -> None:
    policy = SlowStart.for_batch(64, 16, slow=True)
    assert (policy.window, policy.full, policy.step) == (16, 64, 3)
    for _ in range(15):
        assert policy.learn(["stop"], tripped=False)
    assert policy.window == 61
    assert policy.learn(["stop"], tripped=False)
    assert policy.window == 64
    assert not policy.learn(["stop"], tripped=False) and policy.window == 64


@pytest.mark.parametrize(("full", "min_samples"), [(256, 16), (100, 16), (17, 16), (64, 5), (1000, 1)])
def test_min_samples_stops_always_reach_full_width_and_never_more(full: int, min_samples: int) -> None:
    policy = SlowStart.for_batch(full, min_samples, slow=True)
    assert policy.window == min_samples
    widths = []
    for _ in range(min_samples):
        policy.learn(["stop"], tripped=False)
        widths.append(policy.window)
    assert widths == sorted(widths) and widths[-1] == full


def test_a_never_stopping_model_never_widens_it() -> None:
    policy = SlowStart.for_batch(64, 16, slow=True)
    for labels in (["length"], ["repetition"], ["usage_at_cap"], ["abort"], ["error"], ["length", "length"]):
        assert not policy.learn(labels, tripped=False)
    assert policy.window == 16


def test_only_the_stops_of_a_batched_response_widen_it() -> None:
    policy = SlowStart.for_batch(64, 16, slow=True)
    assert policy.learn(["length", "stop", "usage_below_cap", "length"], tripped=False)
    assert policy.window == 16 + 2 * 3


@pytest.mark.parametrize("labels", [None, []])
def test_an_answer_that_cannot_be_evidence_widens_it_like_a_stop(labels: list[str] | None) -> None:
    policy = SlowStart.for_batch(64, 16, slow=True)
    assert policy.learn(labels, tripped=False) and policy.window == 19


def test_a_trip_never_widens_it_again() -> None:
    policy = SlowStart.for_batch(64, 16, slow=True)
    policy.learn(["stop"], tripped=False)
    assert not policy.learn(["stop"], tripped=True)
    assert not policy.learn(["stop"], tripped=False)
    assert not policy.learn(None, tripped=False)
    assert policy.window == 19


@pytest.mark.parametrize(("full", "slow", "window"), [(16, True, 16), (8, True, 8), (64, False, 64), (1, True, 1)])
def test_no_slow_start_below_min_samples_or_when_off(full: int, slow: bool, window: int) -> None:
    policy = SlowStart.for_batch(full, 16, slow=slow)
    assert policy.window == policy.full == window
    assert not policy.learn(["stop"], tripped=False)


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
    async def window(mode: str, concurrent: int, can_be_evidence: bool = True) -> int:
        gate = Gates(contract.Settings(slow_start=mode)).for_running_loop(_Model(concurrent), can_be_evidence)
        assert gate is not None
        return gate.policy.window

    assert asyncio.run(window("auto", 64)) == 16
    assert asyncio.run(window("auto", 256)) == 256
    assert asyncio.run(window("on", 256)) == 16
    assert asyncio.run(window("off", 64)) == 64
    assert asyncio.run(window("on", 64, can_be_evidence=False)) == 64


async def _hold(gate: Gate, name: str, admitted: list[str], release: asyncio.Event) -> None:
    await gate.acquire()
    admitted.append(name)
    try:
        await release.wait()
    finally:
        gate.release()


async def test_the_gate_admits_up_to_the_window_in_arrival_order_and_widening_lets_more_in() -> None:
    gate = Gate(SlowStart.for_batch(8, 2, slow=True))  # window 2, step 3
    admitted: list[str] = []
    release = asyncio.Event()
    tasks = [asyncio.create_task(_hold(gate, str(i), admitted, release)) for i in range(8)]
    await asyncio.sleep(0)
    assert admitted == ["0", "1"] and gate.in_flight == 2
    gate.learn(["stop"], tripped=False)
    await asyncio.sleep(0)
    assert admitted == ["0", "1", "2", "3", "4"] and gate.in_flight == 5
    gate.learn(["length"], tripped=False)
    await asyncio.sleep(0)
    assert len(admitted) == 5
    release.set()
    await asyncio.gather(*tasks)
    assert admitted == [str(i) for i in range(8)] and gate.peak == 5 and gate.in_flight == 0


async def test_a_call_cancelled_at_the_gate_never_holds_a_place() -> None:
    gate = Gate(SlowStart.for_batch(4, 1, slow=True))  # window 1
    admitted: list[str] = []
    release = asyncio.Event()
    first = asyncio.create_task(_hold(gate, "first", admitted, release))
    parked = asyncio.create_task(_hold(gate, "parked", admitted, release))
    last = asyncio.create_task(_hold(gate, "last", admitted, release))
    await asyncio.sleep(0)
    parked.cancel()
    release.set()
    await asyncio.gather(first, last)
    assert parked.cancelled() and admitted == ["first", "last"] and gate.in_flight == 0


async def test_a_place_handed_over_as_the_call_is_cancelled_is_passed_on() -> None:
    gate = Gate(SlowStart.for_batch(4, 1, slow=True))  # window 1
    admitted: list[str] = []
    release = asyncio.Event()
    parked = asyncio.create_task(_hold(gate, "parked", admitted, release))
    await gate.acquire()
    await asyncio.sleep(0)
    gate.release()  # hands the place to the parked call...
    parked.cancel()  # ...which is cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await parked
    assert gate.in_flight == 0
    await asyncio.wait_for(gate.acquire(), 1)
    assert gate.in_flight == 1
