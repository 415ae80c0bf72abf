"""The outer gate: at most ``num_concurrent`` generate calls past the point of no return,
and, at first, only as many as the trip rule needs (the slow start).

lm-eval builds every request's payload before it awaits its own semaphore, so all of them
carry their ``max_tokens`` from the start; holding the calls here instead keeps the rest
cancellable. One gate per event loop, because lm-eval calls ``asyncio.run`` (a new loop)
for every batch of requests (one batch per group of ``gen_kwargs``) and an asyncio
primitive belongs to one loop.

The slow start: the rule cannot fire before ``MIN_SAMPLES`` observations, so a model that
never stops needs only ``MIN_SAMPLES`` full-length generations for its verdict. A batch
therefore starts with at most ``MIN_SAMPLES`` calls in flight, and every answer that shows
the model stops widens the window by ``step``, chosen so that ``MIN_SAMPLES`` such answers
open it fully. A never-stopping model never widens it; a healthy one is at full width after
its first ``MIN_SAMPLES`` answers. The gate only delays calls, in arrival order: no answer
changes, only when each request is sent.

:class:`SlowStart` is the policy, pure arithmetic; :class:`Gate` applies it to asyncio
tasks; :class:`Gates` keeps one gate per event loop.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from probe.runtime.contract import Settings
from probe.runtime.evidence import is_pathological

# Finish reasons that end a request without saying whether the model would have stopped:
# the server or the client gave up on it. They neither widen the gate nor count as a stop.
NOT_A_STOP = frozenset({"abort", "error", "timeout", "cancelled"})
# Under HYPERLOOM_EVAL_PROBE_SLOW_START=auto the slow start applies up to this concurrency:
# measured on healthy simulated runs (benchmarks/RESULTS.md, "Cost on a healthy run"), it kept
# the median wall time within 2% at C=64 and did not at C=256.
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
    """How many calls of one batch may be in flight (pure).

    Promises: the window starts at ``min(MIN_SAMPLES, full)`` when slow, at ``full``
    otherwise; it never exceeds ``full`` and never narrows; it widens only by ``step`` per
    stop, or per answer that cannot be evidence (the rule cannot use it, so holding calls
    back for it buys nothing); once told of a trip it never widens again.
    """

    full: int
    window: int
    step: int
    tripped: bool = False

    @classmethod
    def for_batch(cls, full: int, min_samples: int, slow: bool) -> SlowStart:
        """The policy of a batch of ``full`` concurrent calls; ``slow=False`` opens it at once."""
        if not slow or full <= min_samples:
            return cls(full, full, 0)
        # Ceiling division: MIN_SAMPLES stops always reach full width.
        return cls(full, min_samples, -(-(full - min_samples) // min_samples))

    def learn(self, labels: Sequence[str] | None, tripped: bool) -> bool:
        """Take one finished call's labels (None: never observed); True when it widened."""
        self.tripped = self.tripped or tripped
        if self.tripped or self.window >= self.full:
            return False
        credits = sum(1 for label in labels if is_stop(label)) if labels else 1
        if not credits:
            return False
        self.window = min(self.full, self.window + credits * self.step)
        return True


class Gate:
    """First-come first-served admission of one event loop's calls, ``policy.window`` at once.

    Promises: at most ``policy.window`` calls hold a place; places are handed out in the
    order calls arrived; a call cancelled while it waits never holds a place afterwards.
    ``peak`` is the most calls that ever held a place at once.
    """

    def __init__(self, policy: SlowStart) -> None:
        self.policy = policy
        self.in_flight = 0
        self.peak = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if not self._waiters and self.in_flight < self.policy.window:
            self._admit()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # It was handed a place in the same instant it was cancelled: pass it on.
                self.release()
            raise

    def release(self) -> None:
        self.in_flight -= 1
        self._wake()

    def learn(self, labels: Sequence[str] | None, tripped: bool) -> None:
        """Tell the policy how one call ended, and admit whoever the widening lets in."""
        if self.policy.learn(labels, tripped):
            self._wake()

    def _admit(self) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def _wake(self) -> None:
        while self._waiters and self.in_flight < self.policy.window:
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

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._by_loop.values()))

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
                slow = can_be_evidence and slow_start_applies(self._settings.slow_start, size)
                policy = SlowStart.for_batch(size, self._settings.min_samples, slow)
                gate = self._by_loop[loop] = Gate(policy)
        return gate
