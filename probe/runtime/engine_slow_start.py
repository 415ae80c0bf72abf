"""The slow start inside lm-eval's in-process vLLM engine (the API path's is ``gate``).

``LLM.generate`` adds every prompt to the engine before its first step, and vLLM then runs as
many as ``max_num_seqs`` at once: a model that never stops made ``max_num_seqs`` full-length
generations (or, with the loop detector, ``max_num_seqs`` flagged prefixes) before the rule,
which needs ``MIN_SAMPLES`` observations, could decide. Here the engine's ``add_request`` is
held back as the gate holds calls: the same :class:`~probe.runtime.gate.SlowStart` policy
lets ``MIN_SAMPLES`` requests in before any evidence, ``per_stop`` more for each generation
that did not end pathologically, and everything once the rule has fired (a tripped group's
held requests are never sent) or could not be applied. The engine queues what it cannot run
yet, so only the policy's budget holds a request back, never the engine's occupancy.

lm-eval's order is already the seeded sample order when the engine sees the prompts
(``order``), so the requests let in first are a uniform sample; they keep that order.

**Liveness.** After every engine step, when the engine has nothing unfinished and requests
are still held, the policy is opened (``SlowStart.run_dry``) and they are sent: the engine
loop (``while has_unfinished_requests(): step()``) never ends with a request held. A held
request's own ``add_request`` runs later than lm-eval asked for it; an error it raises then
propagates from the engine step, out of ``LLM.generate``, as it would have at the start.

Pure bookkeeping: no vLLM import; the engine is reached through the callables it is given.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from probe.runtime.contract import Settings
from probe.runtime.gate import SlowStart, slow_start_applies


@dataclass
class EngineSlowStart:
    """The held ``add_request`` calls of one ``LLM.generate`` call, by place (prompt index).

    Promises: a request is sent, in the order offered, once the policy's budget allows (never
    while an earlier one is held); :meth:`admit` leaves nothing held while the engine has
    nothing unfinished; a held request whose group tripped is never sent, and is named in
    ``never_sent``.
    """

    policy: SlowStart
    held: deque[tuple[int, Callable[[], Any]]] = field(default_factory=deque)
    waiting: set[int] = field(default_factory=set)  # the places in ``held``
    never_sent: set[int] = field(default_factory=set)

    @classmethod
    def for_engine(cls, settings: Settings, max_num_seqs: Any, can_be_evidence: bool) -> EngineSlowStart | None:
        """The slow start of a call to an engine running ``max_num_seqs`` at once, or None
        when the knob leaves it off there (under ``auto`` an unknown width counts as wide)."""
        known = isinstance(max_num_seqs, int) and not isinstance(max_num_seqs, bool) and max_num_seqs > 0
        mode = settings.slow_start
        if not can_be_evidence or not (slow_start_applies(mode, max_num_seqs) if known else mode == "on"):
            return None
        policy = SlowStart.for_batch(max_num_seqs if known else 1, settings.min_samples, settings.length_ratio, True)
        return cls(policy)

    def offer(self, place: int, add: Callable[[], Any]) -> bool:
        """Whether ``add`` (the engine's ``add_request`` for ``place``) is to run now; else it is held."""
        if not self.held and self.policy.may_send_more():
            self.policy.send()
            return True
        self.held.append((place, add))
        self.waiting.add(place)
        return False

    def finished(self, labels: Sequence[str] | None, tripped: bool, unprobed: bool) -> None:
        """Take how one sent request ended: ``labels`` as the rule read its answers."""
        self.policy.finished(True, labels, tripped, unprobed)

    def group_stands(self, tripped: bool, unprobed: bool) -> None:
        """Take where a group of the call stands (a trip by a flag ends no request)."""
        self.policy.learn(tripped, unprobed)

    def admit(self, engine_busy: Callable[[], bool], tripped: Callable[[int], bool]) -> None:
        """Send the held requests the policy now allows, in order; when it allows none and
        ``engine_busy()`` says the engine has nothing unfinished, open the policy first. An
        error from a request's ``add_request`` propagates."""
        while self.held:
            if not (self.policy.tripped or self.policy.may_send_more()):
                if engine_busy():
                    return
                self.policy.run_dry()
            place, add = self.held.popleft()
            self.waiting.discard(place)
            if tripped(place):
                self.never_sent.add(place)
                continue
            if not self.policy.tripped:
                self.policy.send()
            add()
