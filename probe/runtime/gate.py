"""The outer gate: at most ``num_concurrent`` generate calls past the point of no return,
at first only as many as the trip rule needs (the slow start), released in a seeded random
order so that the rule judges a uniform sample of the batch.

lm-eval builds every request's payload before it awaits its own semaphore, so all of them
carry their ``max_tokens`` from the start; holding the calls here instead keeps the rest
cancellable. One gate per event loop, because lm-eval calls ``asyncio.run`` (a new loop)
for every batch of requests (one batch per group of ``gen_kwargs``) and an asyncio
primitive belongs to one loop.

**The sample.** lm-eval creates all of a batch's tasks at once, longest prompt first, and
each reaches the gate in the loop's next iteration. The gate parks every call, and chooses
only once an iteration of the loop has passed with no new arrival: then it releases them in
the order of a priority drawn for each from the seed and its place of arrival (``sampling``),
so the first ``MIN_SAMPLES`` sent are a uniform random sample of the whole batch, whatever
order lm-eval used. The gate only delays calls: no answer changes, only when each request
is sent.

**The slow start.** The rule cannot fire before ``MIN_SAMPLES`` observations, so a model that
never stops needs only ``MIN_SAMPLES`` full-length generations for its verdict. A batch
therefore may send ``MIN_SAMPLES`` requests before any evidence, and each generation that did
not run to the cap lets ``per_stop`` more be sent (a stop, and equally any other ending: an
error, a timeout, an abort, a finish reason nobody knows); an answer with no generation the
probe could read (malformed, empty, unparsable, or not evidence) counts as one such. An
answer at the cap lets none more, so a never-stopping model reaches the server with exactly
``MIN_SAMPLES`` requests. ``per_stop`` is at least ``1 / (1 - LENGTH_RATIO)``, and also at
least ``2 * num_concurrent / MIN_SAMPLES``, so that a healthy model is at full width after
``MIN_SAMPLES / 2`` stops: with ``1 / (1 - LENGTH_RATIO)`` alone (4 at the defaults) the ramp to
C=64 cost healthy simulated runs 2.3% of their generation time, over the 2% this project
allows (benchmarks/RESULTS.md).

**Liveness (a probed run never stalls).** Invariant: *once the loop has settled, the gate
never holds a parked call while none is in flight.* Every change to the parked or in-flight
calls ends in ``_wake``, which admits while the policy allows; if it would stop with calls
parked and none in flight, the policy is opened (``SlowStart.run_dry``). So as long as each
call let through ends (lm-eval's own timeout bounds it), every parked call is let through
after finitely many ends, and a call that fails gives its place back for the retry.
The guard is never what decides when the rule judges the gate's own answers, because the
gate can only run dry once the rule has fired. Proof: let ``a`` calls have been answered and
none be in flight, so ``a >= budget = MIN + per_stop * c``, where ``c = s + e`` counts the
``s`` generations not at the cap and the ``e`` answers without a readable generation. The
rule has observed ``L >= a - e`` generations, ``k = L - s`` of them at the cap. Then
``k >= a - e - s >= MIN + (per_stop - 1) * c >= MIN``, and, since ``per_stop >= 1 / (1 - r)``
gives ``c <= (1 - r) * a``, ``k - r * L = (1 - r) * L - s >= (1 - r) * (a - e) - s >= (1 - r) * a - c
>= 0``: at least ``MIN`` observations, at least ``LENGTH_RATIO`` of them at the cap, so the
rule fired (the gate then lets everything through; if the trip could not be applied, the
policy is open). tests/test_gate_liveness.py checks both with hypothesis, on a real loop.
The sync API path has no gate: nothing there waits on evidence. The in-process vLLM engine
applies this same policy to its ``add_request`` (``engine_slow_start``).

:class:`SlowStart` is the policy, pure arithmetic; :class:`Gate` applies it to asyncio
tasks; :class:`Gates` keeps one gate per event loop.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from probe.runtime.contract import Settings
from probe.runtime.evidence import is_pathological
from probe.runtime.sampling import Sampling, rank

# Under HYPERLOOM_EVAL_PROBE_SLOW_START=auto the slow start applies up to this concurrency:
# on healthy simulated runs (benchmarks/RESULTS.md, "Cost on a healthy run") it cost 1.4-1.5%
# of the generation time at C=64; at C=256 6-8% (measured with half today's step there; off
# by default either way); 128 was not measured, so it is off there too.
AUTO_MAX_CONCURRENT = 64


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
      ``per_stop`` for every generation that did not run to the cap, and for every answer
      that carries no generation the rule could judge; it never shrinks;
    - after a trip it never grows again; after a trip that could not be applied (the probe
      then runs unprobed), or once :meth:`run_dry` was called, it is infinite.
    """

    full: int
    budget: float
    per_stop: float
    sent: int = 0
    tripped: bool = False
    ran_dry: bool = False  # the liveness guard opened it (see the module's docstring)

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
        return in_flight < self.full and self.may_send_more()

    def may_send_more(self) -> bool:
        """Whether the budget allows another request, whatever is in flight."""
        return self.sent < self.budget

    def send(self) -> None:
        self.sent += 1

    def finished(self, answered: bool, labels: Sequence[str] | None, tripped: bool, unprobed: bool) -> None:
        """Take how one sent call ended: ``labels`` is what its answer said (None: never observed)."""
        self.learn(tripped, unprobed)
        if self.tripped:
            return
        if not answered:
            self.sent -= 1
            return
        credits = sum(1 for label in labels if not is_pathological(label)) if labels else 1
        if credits:  # never 0 * inf: that is NaN, and a NaN budget lets nothing through
            self.budget += credits * self.per_stop

    def learn(self, tripped: bool, unprobed: bool) -> None:
        """Take where the batch's group stands: tripped (the budget never grows again), or
        tripped but not applied (the probe runs unprobed: the budget is infinite)."""
        self.tripped = self.tripped or tripped
        if unprobed and not self.tripped:
            self.budget = math.inf

    def run_dry(self) -> None:
        """Open for good: calls are parked, none is in flight, and the rule has not decided."""
        self.ran_dry = True
        self.budget = math.inf


class Gate:
    """Admission of one event loop's calls, as its policy allows, in a seeded random order.

    Promises: every call is parked until the loop has settled (an iteration with no new
    arrival), then let through in the order of a priority drawn from ``seed`` and its place
    of arrival, each counted as sent by the policy; a call cancelled while it waits never
    counts; once the policy has tripped, every waiting call is let through at once without
    counting (its group answers it blank, and it never reaches the server); once settled,
    calls are never parked while none is in flight (the liveness invariant). Every call let
    through must be released exactly once.
    """

    def __init__(self, policy: SlowStart, seed: str = "") -> None:
        self.policy = policy
        self.in_flight = 0
        self._seed = seed
        self._arrivals = 0
        self._parked: list[tuple[int, int, asyncio.Future[None]]] = []  # a heap, by priority
        self._unsettled = 0  # arrivals since the loop last settled
        self._settling = False

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        heapq.heappush(self._parked, (rank(self._seed, str(self._arrivals)), self._arrivals, waiter))
        self._arrivals += 1
        self._unsettled += 1
        if not self._settling:
            self._settling = True
            loop.call_soon(self._settle, loop)
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

    def _settle(self, loop: asyncio.AbstractEventLoop) -> None:
        # lm-eval's tasks all reach the gate in one iteration; waiting for an iteration with
        # no new arrival makes the draw cover all of them, not the first few.
        if self._unsettled:
            self._unsettled = 0
            loop.call_soon(self._settle, loop)
            return
        self._settling = False
        self._wake()

    def _may_admit(self) -> bool:
        return self.policy.tripped or self.policy.may_send(self.in_flight)

    def _admit(self) -> None:
        self.in_flight += 1
        if not self.policy.tripped:
            self.policy.send()

    def _wake(self) -> None:
        if self._settling:
            return  # the settle callback wakes it
        while True:
            while self._parked and self._parked[0][2].done():  # cancelled while it waited
                heapq.heappop(self._parked)
            if not self._parked:
                return
            if not self._may_admit():
                if self.in_flight:
                    return
                self.policy.run_dry()
            waiter = heapq.heappop(self._parked)[2]
            self._admit()
            waiter.set_result(None)


class Gates:
    """One gate per running event loop, as wide as the model's ``num_concurrent``."""

    def __init__(self, settings: Settings | None = None, sampling: Sampling | None = None) -> None:
        self._settings = settings or Settings()
        self.sampling = sampling or Sampling()
        self._by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._by_loop)

    def for_running_loop(self, lm: Any, can_be_evidence: bool = True, group: str = "") -> Gate | None:
        """The gate of the running loop, or None when the model has no usable concurrency.

        A loop's gate is made by its first call: it starts slow when the knob says so for this
        concurrency and that call's answer can be evidence (a batch shares its ``max_tokens``,
        so a batch whose answers cannot trip anything is never held back). Its order is drawn
        from the sampling seed and ``group`` (the batch's group key).
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
                gate = self._by_loop[loop] = Gate(policy, f"{self.sampling.seed}\0{group}")
        return gate
