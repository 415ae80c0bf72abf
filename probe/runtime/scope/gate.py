"""The outer gate: at most ``num_concurrent`` generate calls past the point of no return.

At first it lets through only as many as the trip rule needs (the slow start).
Calls go through in the order they arrive, sample first; the gate only delays them, so no answer changes.
A model that never stops reaches the server with exactly ``MIN_SAMPLES`` requests.
Liveness: the gate never holds a parked call while none is in flight.
:class:`SlowStart` is the policy, :class:`Gate` applies it, :class:`Gates` keeps one gate per event loop.
See docs/gate.md.
"""

from __future__ import annotations

import asyncio
import math
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from probe.runtime.core.contract import Settings
from probe.runtime.core.evidence import ended_by_model, is_pathological

# Under HYPERLOOM_EVAL_PROBE_SLOW_START=auto the slow start applies up to this concurrency:
# above it, a healthy run's wait for its first stop cost 3-6% (docs/benchmarks.md).
AUTO_MAX_CONCURRENT = 64


def slow_start_applies(mode: str, num_concurrent: int) -> bool:
    """Whether a batch at ``num_concurrent`` starts slow under the knob's ``mode``."""
    if mode == "auto":
        return num_concurrent <= AUTO_MAX_CONCURRENT
    return mode == "on"


@dataclass
class SlowStart:
    """How many requests of one batch may be sent, and how many at once (pure).

    At most ``full`` calls run at once, and at most ``allowance`` requests are sent; a retry replaces its failed call.
    The allowance starts at ``MIN_SAMPLES`` when slow, else infinite, and never shrinks.
    It grows by ``per_stop`` for each generation the model ended itself, by ``per_ending`` for any
    other ending not at the cap (an error, a timeout), and never after a trip.
    See docs/gate.md.
    """

    full: int
    allowance: float
    per_stop: float
    per_ending: float = 0.0
    sent: int = 0
    tripped: bool = False
    ran_dry: bool = False  # the liveness guard opened it (see the module's docstring)

    @classmethod
    def for_batch(cls, full: int, min_samples: int, length_ratio: float, slow: bool) -> SlowStart:
        """The policy of a batch of ``full`` concurrent calls; ``slow=False`` opens it at once."""
        # Also when full <= MIN_SAMPLES: a healthy model never meets the allowance there (each
        # stop frees a place and adds more than one send), while a never-stopping one would
        # otherwise refill the places its answers at the cap free before the rule can fire.
        if not slow:
            return cls(full, math.inf, 0.0)
        # A generation the model ended itself opens the gate to full width: a healthy model then
        # waits only for its first stop. Any other ending (an error, a timeout) says nothing of
        # the model, and opens it by a share (docs/gate.md). Each at least 1 / (1 - ratio): a
        # stall then implies the rule fired. A ratio of 1 can never fire after an ending.
        floor = 1.0 / (1.0 - length_ratio) if length_ratio < 1.0 else math.inf
        return cls(full, float(min_samples), max(floor, float(full)), max(floor, 2 * full / min_samples))

    def may_send(self, in_flight: int) -> bool:
        return in_flight < self.full and self.may_send_more()

    def may_send_more(self) -> bool:
        """Whether the allowance allows another request, whatever is in flight."""
        return self.sent < self.allowance

    def send(self, generations: int = 1) -> None:
        """A request of ``generations`` prompts was sent (the allowance counts generations)."""
        self.sent += generations

    def finished(
        self,
        answered: bool,
        labels: Sequence[str] | None,
        tripped: bool,
        unprobed: bool,
        settled: bool = False,
        generations: int = 1,
    ) -> None:
        """Take how one sent call of ``generations`` prompts ended: ``labels`` is what its answer
        said (None: never observed)."""
        self.learn(tripped, unprobed, settled)
        if self.tripped:
            return
        if not answered:
            self.sent -= generations
            return
        if not labels:  # an answer with no generation the rule could judge: an ending like an error
            self.allowance += self.per_ending
            return
        for label in labels:  # added one by one: never 0 * inf, a NaN that would let nothing through
            if ended_by_model(label):
                self.allowance += self.per_stop
            elif not is_pathological(label):
                self.allowance += self.per_ending

    def learn(self, tripped: bool, unprobed: bool, settled: bool = False) -> None:
        """Take where the batch's group stands: tripped, tripped but not applied, or settled.

        After a trip the allowance never grows again. Not applied or settled, it is infinite.
        """
        self.tripped = self.tripped or tripped
        if (unprobed or settled) and not self.tripped:
            self.allowance = math.inf

    def run_dry(self) -> None:
        """Open for good: calls are parked, none is in flight, and the rule has not decided."""
        self.ran_dry = True
        self.allowance = math.inf


class Gate:
    """Admission of one event loop's calls, in the order they arrive, as its policy allows.

    Parked calls go through in arrival order; a call cancelled while it waits never counts.
    After a trip, waiting calls go through at once, uncounted, and are answered blank.
    No call is parked while none is in flight. Each call let through is released exactly once.
    See docs/gate.md.
    """

    def __init__(self, policy: SlowStart) -> None:
        self.policy = policy
        self.in_flight = 0
        self._parked: deque[tuple[asyncio.Future[None], int]] = deque()

    async def acquire(self, generations: int = 1) -> None:
        """Wait until a call of ``generations`` prompts may go through."""
        if not self._parked and self._may_admit():
            self._admit(generations)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._parked.append((waiter, generations))
        self._wake()  # none in flight: the liveness guard lets it through
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # It was let through in the same instant it was cancelled: pass its place on.
                self.release(answered=False, generations=generations)
            raise

    def release(
        self,
        answered: bool,
        labels: Sequence[str] | None = None,
        tripped: bool = False,
        unprobed: bool = False,
        settled: bool = False,
        generations: int = 1,
    ) -> None:
        """End a call of ``generations`` prompts that was let through: how it ended, and where
        its group stands. Should the policy fail, the gate opens for good (the parked calls
        run unprobed, never wait for ever) and the error is raised."""
        self.in_flight -= 1
        try:
            self.policy.finished(answered, labels, tripped, unprobed, settled, generations)
        except Exception:
            self.policy.run_dry()
            raise
        finally:
            self._wake()

    def _may_admit(self) -> bool:
        return self.policy.tripped or self.policy.may_send(self.in_flight)

    def _admit(self, generations: int) -> None:
        self.in_flight += 1
        if not self.policy.tripped:
            self.policy.send(generations)

    def _wake(self) -> None:
        while True:
            while self._parked and self._parked[0][0].done():  # cancelled while it waited
                self._parked.popleft()
            if not self._parked:
                return
            if not self._may_admit():
                if self.in_flight:
                    return
                self.policy.run_dry()
            waiter, generations = self._parked.popleft()
            self._admit(generations)
            waiter.set_result(None)


class Gates:
    """One gate per running event loop, as wide as the model's ``num_concurrent``."""

    def __init__(self, settings: Settings | None = None) -> None:
        self._settings = settings or Settings()
        self._by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_loop)

    def for_running_loop(self, lm: Any, can_be_evidence: bool = True) -> Gate | None:
        """The gate of the running loop, or None when the model has no usable concurrency.

        The loop's first call makes it. It starts slow only where the knob says so and that call can be evidence.
        See docs/gate.md.
        """
        size = getattr(lm, "_concurrent", None)
        if not isinstance(size, int) or size < 1:
            return None
        loop = asyncio.get_running_loop()
        with self._lock:
            gate = self._by_loop.get(loop)
            if gate is None:
                settings = self._settings
                slow = can_be_evidence and slow_start_applies(settings.slow_start, size)
                policy = SlowStart.for_batch(size, settings.min_samples, settings.length_ratio, slow)
                gate = self._by_loop[loop] = Gate(policy)
        return gate
