"""The slow start inside lm-eval's in-process vLLM engine (the API path's is ``gate``).

The engine's ``add_request`` is held back as the gate holds calls, with the same
:class:`~probe.runtime.scope.gate.SlowStart` policy, one per group across the ``LLM.generate`` calls
it comes in: ``MIN_SAMPLES`` of a group's requests reach the engine before any evidence, then
more as its generations end (the whole width at the model's first stop), all of them once the
group's sample is final, none more once it tripped. Liveness: the engine loop never ends with a
request held. Pure bookkeeping: no vLLM import. docs/engine-slow-start.md has the details.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from probe.runtime.core.contract import Settings
from probe.runtime.scope.gate import SlowStart, slow_start_applies
from probe.runtime.scope.groups import Group


class AddFailed(Exception):
    """The engine's own ``add_request`` raised, for a request sent late: its error (the cause)
    is lm-eval's to see, as it would have been when LLM.generate added the request."""


@dataclass
class _Held:
    """One group's part of a call: its requests held back, in order, and its requests in the engine."""

    group: Group
    policy: SlowStart
    held: deque[tuple[int, Callable[[], Any]]] = field(default_factory=deque)
    in_engine: int = 0


@dataclass
class EngineSlowStart:
    """The held ``add_request`` calls of one ``LLM.generate`` call, by place (prompt index).

    A request is sent once its group's allowance allows, in the order offered within its group.
    :meth:`admit` holds nothing while the engine has nothing unfinished.
    Nor does it hold a group's requests while none of that group's is in the engine.
    A held request whose group tripped is never sent, and is named in ``never_sent``.
    """

    width: int  # the engine's max_num_seqs: the concurrency each group's policy is made for
    settings: Settings
    groups: dict[int, _Held] = field(default_factory=dict)
    never_sent: set[int] = field(default_factory=set)

    @property
    def waiting(self) -> set[int]:
        """The places held now (read at a trip and once a call, never per step)."""
        return {place for part in self.groups.values() for place, _ in part.held}

    @classmethod
    def for_engine(cls, settings: Settings, max_num_seqs: Any, can_be_evidence: bool) -> EngineSlowStart | None:
        """The slow start of a call to an engine running ``max_num_seqs`` at once.

        None when the knob leaves it off there; under ``auto`` an unknown width counts as wide.
        """
        known = isinstance(max_num_seqs, int) and not isinstance(max_num_seqs, bool) and max_num_seqs > 0
        mode = settings.slow_start
        if not can_be_evidence or not (slow_start_applies(mode, max_num_seqs) if known else mode == "on"):
            return None
        return cls(max_num_seqs if known else 1, settings)

    def _of(self, group: Group) -> _Held:
        part = self.groups.get(id(group))
        if part is None:
            policy = group.engine_slow_start
            if policy is None:
                s = self.settings
                policy = group.engine_slow_start = SlowStart.for_batch(self.width, s.min_samples, s.length_ratio, True)
            part = self.groups[id(group)] = _Held(group, policy)
        return part

    def offer(self, place: int, group: Group, add: Callable[[], Any], evidence: bool = True) -> bool:
        """Whether ``add`` (the engine's ``add_request`` for ``place``, of ``group``) is to run
        now; else it is held. A request that is not evidence (the rule never reads it) runs now,
        as the gate never holds back a batch whose answers cannot trip anything."""
        if not evidence:
            return True
        part = self._of(group)
        if not part.held and part.policy.may_send_more():
            part.policy.send()
            part.in_engine += 1
            return True
        part.held.append((place, add))
        return False

    def finished(self, group: Group, labels: Sequence[str] | None) -> None:
        """Take how one sent request of ``group`` ended: ``labels`` as the rule read its answers."""
        part = self._of(group)
        part.in_engine -= 1
        part.policy.finished(True, labels, group.tripped, group.trip_failed, group.settled)

    def admit(self, engine_busy: Callable[[], bool]) -> None:
        """Send the held requests the policies now allow, in order (see the module's docstring
        for when a policy opens); raises AddFailed when a request's ``add_request`` raised."""
        idle = not engine_busy()
        for part in self.groups.values():
            policy = part.policy
            policy.learn(part.group.tripped, part.group.trip_failed, part.group.settled)  # a flag ends no request
            while part.held:
                if part.group.tripped:
                    self._never_send(part)
                    break
                if not (policy.tripped or policy.may_send_more()):
                    if part.in_engine > 0 and not idle:
                        break
                    policy.run_dry()
                _, add = part.held.popleft()
                if not policy.tripped:
                    policy.send()
                part.in_engine += 1
                _add(add)

    def release_all(self) -> None:
        """Send every held request at once (a tripped group's: never), whatever the policies say;
        raises AddFailed when a request's ``add_request`` raised."""
        for part in self.groups.values():
            if part.group.tripped:
                self._never_send(part)
            while part.held:
                _, add = part.held.popleft()
                _add(add)

    def _never_send(self, part: _Held) -> None:
        while part.held:
            place, _ = part.held.popleft()
            self.never_sent.add(place)


def _add(add: Callable[[], Any]) -> None:
    try:
        add()
    except Exception as error:
        raise AddFailed from error
