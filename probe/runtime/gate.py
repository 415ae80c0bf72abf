"""The outer gate: at most ``num_concurrent`` generate calls past the point of no return,
and, at first, only as many as the trip rule needs (the slow start).

lm-eval builds every request's payload before it awaits its own semaphore, so all of them
carry their ``max_tokens`` from the start; holding the calls here instead keeps the rest
cancellable. One gate per event loop, because lm-eval calls ``asyncio.run`` (a new loop)
for every batch of requests (one batch per group of ``gen_kwargs``) and an asyncio
primitive belongs to one loop.

The slow start: the rule cannot fire before ``MIN_SAMPLES`` observations, so a model that
never stops needs only ``MIN_SAMPLES`` full-length generations for its verdict. A batch
therefore may send ``MIN_SAMPLES`` requests before any evidence, and each answer that shows
the model stops lets ``per_stop`` more be sent; an answer that ran to the cap lets none
more, so a never-stopping model reaches the server with exactly ``MIN_SAMPLES`` requests.
``per_stop`` is at least ``1 / (1 - LENGTH_RATIO)``: then the gate can only run dry once the
rule has fired (at that point at least ``LENGTH_RATIO`` of the answers ran to the cap), so
it never stalls a run. It is also at least ``2 * num_concurrent / MIN_SAMPLES``, so that a
healthy model is at full width after ``MIN_SAMPLES / 2`` stops: with ``1 / (1 - LENGTH_RATIO)``
alone (4 at the defaults) the ramp to C=64 cost healthy simulated runs 2.3% of their
generation time, over the 2% this project allows (benchmarks/RESULTS.md). A larger step
spends more on a partly broken model whose stops arrive first, never more on one that
never stops. The gate only delays calls, in arrival order: no answer changes, only when
each request is sent.

:class:`SlowStart` is the policy, pure arithmetic; :class:`Gate` applies it to asyncio
tasks; :class:`Gates` keeps one gate per event loop.
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

from probe.runtime.contract import Settings
from probe.runtime.evidence import is_pathological

# Finish reasons that end a request without saying whether the model would have stopped:
# the server or the client gave up on it. They count as neither a stop nor a cap.
NOT_A_STOP = frozenset({"abort", "error", "timeout", "cancelled"})
# Under HYPERLOOM_EVAL_PROBE_SLOW_START=auto the slow start applies up to this concurrency:
# on healthy simulated runs (benchmarks/RESULTS.md, "Cost on a healthy run") it cost 1.4-1.5%
# of the generation time at C=64; at C=256 6-8% (measured with half today's step there; off
# by default either way); 128 was not measured, so it is off there too.
AUTO_MAX_CONCURRENT = 64


def is_stop(label: str) -> bool:
    """True for an observation that shows the model chose to stop."""
    return not is_pathological(label) and label not in NOT_A_STOP


def slow_start_applies(mode: str, num_concurrent: int) -> bool:
    """Whether a batch at ``num_concurrent`` starts slow under the knob's ``mode``."""
    if mode == "auto":
        return num_concurrent <= AUTO_MAX_CONCURRENT
    return mode == "on"


@dataclass
class SlowStart:
    """How many requests of one batch may be sent, and how many at once (pure).

    Promises:
    - at most ``full`` calls at once, and at most ``budget`` requests sent (counting only
      calls that were answered or are still running: a failed call is retried, and the
      retry is the one that counts);
    - ``budget`` starts at ``MIN_SAMPLES`` when slow (infinite otherwise) and grows by
      ``per_stop`` for every stop, and for every answer that cannot be evidence (the rule
      cannot use it, so holding calls back for it buys nothing); it never shrinks;
    - after a trip it never grows again; after a trip that could not be applied (the probe
      then runs unprobed) it is infinite.
    """

    full: int
    budget: float
    per_stop: float
    sent: int = 0
    tripped: bool = False

    @classmethod
    def for_batch(cls, full: int, min_samples: int, length_ratio: float, slow: bool) -> SlowStart:
        """The policy of a batch of ``full`` concurrent calls; ``slow=False`` opens it at once."""
        # Also when full <= MIN_SAMPLES: a healthy model never meets the budget there (each
        # stop frees a place and adds more than one send), while a never-stopping one would
        # otherwise refill the places its answers at the cap free before the rule can fire.
        if not slow:
            return cls(full, math.inf, 0.0)
        # At least 1 / (1 - ratio): a stall then implies the rule fired (see the module's
        # docstring). A ratio of 1 can never fire after a stop, so one stop opens the gate.
        floor = 1.0 / (1.0 - length_ratio) if length_ratio < 1.0 else math.inf
        return cls(full, float(min_samples), max(floor, 2 * full / min_samples))

    def may_send(self, in_flight: int) -> bool:
        return in_flight < self.full and self.sent < self.budget

    def send(self) -> None:
        self.sent += 1

    def finished(self, answered: bool, labels: Sequence[str] | None, tripped: bool, unprobed: bool) -> None:
        """Take how one sent call ended: ``labels`` is what its answer said (None: never observed)."""
        self.tripped = self.tripped or tripped
        if self.tripped:
            return
        if unprobed:
            self.budget = math.inf
        if not answered:
            self.sent -= 1
            return
        credits = sum(1 for label in labels if is_stop(label)) if labels else 1
        self.budget += credits * self.per_stop


class Gate:
    """First-come first-served admission of one event loop's calls, as its policy allows.

    Promises: calls are let through in the order they arrived, each counted as sent by the
    policy; a call cancelled while it waits never counts; once the policy has tripped, every
    waiting call is let through at once without counting (its group answers it blank, and
    it never reaches the server). Every call let through must be released exactly once.
    """

    def __init__(self, policy: SlowStart) -> None:
        self.policy = policy
        self.in_flight = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if not self._waiters and self._may_admit():
            self._admit()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # It was let through in the same instant it was cancelled: pass its place on.
                self.release(answered=False)
            raise

    def release(
        self, answered: bool, labels: Sequence[str] | None = None, tripped: bool = False, unprobed: bool = False
    ) -> None:
        """End a call that was let through: how it ended, and where its group stands."""
        self.in_flight -= 1
        self.policy.finished(answered, labels, tripped, unprobed)
        self._wake()

    def _may_admit(self) -> bool:
        return self.policy.tripped or self.policy.may_send(self.in_flight)

    def _admit(self) -> None:
        self.in_flight += 1
        if not self.policy.tripped:
            self.policy.send()

    def _wake(self) -> None:
        while self._waiters and self._may_admit():
            waiter = self._waiters.popleft()
            if waiter.done():  # cancelled while it waited
                continue
            self._admit()
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

        A loop's gate is made by its first call: it starts slow when the knob says so for this
        concurrency and that call's answer can be evidence (a batch shares its ``max_tokens``,
        so a batch whose answers cannot trip anything is never held back).
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
