"""Requests and the groups they belong to: lm-eval runs each group of identical generation
settings (``gen_kwargs``: in practice, each task) as one batch, and a trip ends one group."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from probe.runtime.core.degeneration import LoopDetector
from probe.runtime.core.evidence import Tally
from probe.runtime.core.rule import Sample
from probe.runtime.core.sidecar import json_safe
from probe.runtime.scope.gate import SlowStart
from probe.runtime.scope.inflight import InFlight


@dataclass
class Group:
    """Requests that share their generation settings, and the evidence they produced."""

    key: str
    gen_kwargs: dict[str, Any]
    sample: Sample = field(default_factory=lambda: Sample(16, 0.75))
    tally: Tally = field(default_factory=Tally)
    tripped: bool = False
    trip_failed: bool = False
    short_circuited: int = 0
    cancelled: int = 0
    inflight: InFlight = field(default_factory=InFlight)
    # Flagged attempts that failed, by the identity of the prompts lm-eval will retry them with.
    retrying: dict[int, Request] = field(default_factory=dict)
    # The place of each request not answered yet (see rule), by the object lm-eval passed its
    # prompts in (kept, so that its id is not reused): a retry passes the same one, and keeps its place.
    places: dict[int, tuple[Any, int]] = field(default_factory=dict)
    next_place: int = 0
    # The slow start of its requests in lm-eval's in-process vLLM engine, across the
    # LLM.generate calls they come in (engine_slow_start); None until it applies.
    engine_slow_start: SlowStart | None = None

    @property
    def settled(self) -> bool:
        """Its verdict is final without a trip: its sample can neither fire nor grow."""
        return not self.tripped and self.sample.final and not self.sample.fires()

    def summary(self, tasks: set[str]) -> dict[str, Any]:
        return {
            "gen_kwargs": self.gen_kwargs,
            "tasks": sorted(tasks),
            **self.tally.as_dict(),
            "sample": self.sample.as_dict(),
            "tripped": self.tripped,
            "short_circuited_requests": self.short_circuited,
            "cancelled_in_flight": self.cancelled,
        }


# Where a request's budget comes from (``Request.budget_source``).
GIVEN, PREDICTED, READ, UNREADABLE = "given", "predicted", "read", "unreadable"


@dataclass
class Request:
    """One generate request seen by the probe: what it needs, never the shared model object."""

    group: Group
    prompts: list[Any]  # as lm-eval passes them, one per answer
    # Its budget, a positive integer of any size (None: not known): the largest the server may use
    # where the request names two (see ``fewest``).
    max_tokens: int | None
    is_evidence: bool  # its observations count for the rule (see the glossary in contract)
    model: str | None = None  # the served model's name, for the trip record
    base_url: str | None = None  # the server's address, credentials removed
    backend: str = "api"  # which of lm-eval's backends made it: "api" or "vllm" (in-process)
    # The task of each prompt, in order: known at once by a backend that can tell, else taken
    # from the evaluation's task book when first needed (see TaskBook.take).
    tasks: list[str | None] | None = None
    # The smallest budget the server may use, where the request names two that servers read in
    # different orders (a chat request's max_tokens and max_completion_tokens); None: max_tokens.
    fewest: int | None = None
    observed: bool = False
    place: int | None = None  # its place in the order its group's requests were sent (see rule)
    # Where its budget comes from: GIVEN by the backend that made it; PREDICTED (lm-eval's own
    # builder's) until the payload it is sent with is READ; UNREADABLE where that payload cannot be
    # read (its builder is none the probe wraps), and then unknown whatever a wrapped builder it
    # calls returns. A prediction still unread when its response comes is unknown too.
    budget_source: str = GIVEN
    cancelled_by_probe: bool = False
    # What its response said, once observed (None: never observed); the gate learns from it.
    labels: list[str] | None = None
    # The loop detector of each choice fed partial output so far, and the choices it flagged.
    detectors: dict[int, LoopDetector] = field(default_factory=dict)
    flagged: set[int] = field(default_factory=set)
    answering: set[int] = field(default_factory=set)  # the choices past their reasoning
    certain: set[int] = field(default_factory=set)  # the flagged choices whose flag is certain
    # The object lm-eval passed its prompts in: a retry of this call passes the same one.
    source: Any = field(default=None, repr=False, compare=False)

    @property
    def n_answers(self) -> int:
        return len(self.prompts)

    @property
    def budgets(self) -> tuple[int, ...]:
        """Every budget the server may use for it (none where it is not known)."""
        return tuple(sorted({b for b in (self.fewest, self.max_tokens) if b is not None}))

    def take_place(self) -> None:
        """Give it its place in its group's order (a retry of an earlier call keeps that call's)."""
        group, source = self.group, self.source
        place = self._kept_place()
        if place is None:
            place, group.next_place = group.next_place, group.next_place + 1
            if source is not None:
                group.places[id(source)] = (source, place)
            group.sample.join(place, self.n_answers)
        self.place = place

    def answered(self) -> None:
        """It was answered (by the server or blank): no retry of it will come."""
        if self._kept_place() is not None:
            del self.group.places[id(self.source)]

    def _kept_place(self) -> int | None:
        """The place an earlier call with the same prompts object holds, if any."""
        known = self.group.places.get(id(self.source)) if self.source is not None else None
        return known[1] if known is not None and known[0] is self.source else None

    def task_of_choice(self, index: int) -> str | None:
        tasks = self.tasks or []
        return tasks[index] if 0 <= index < len(tasks) else None


def group_key(gen_kwargs: Any) -> tuple[str, dict[str, Any]]:
    """A stable key for a group's generation settings, and the settings as the probe writes them.

    Settings are written through ``json_safe``: lm-eval passes on settings it never sends, such as do_sample=nan.
    Settings that lm-eval's ``Collator`` puts in one batch have one key.
    It groups by ``(name, tuple(value))`` pairs compared with ``==``, else by the names alone.
    So "." and ["."], 0 and 0.0, True and 1 are one group, and a dict counts by its names.
    """
    settings = dict(gen_kwargs) if isinstance(gen_kwargs, Mapping) else {}
    return json.dumps(_canonical(_as_lm_eval_groups(settings)), default=repr), json_safe(settings)


def _as_lm_eval_groups(settings: dict[str, Any]) -> Any:
    try:
        grouped = tuple(
            (name, tuple(value) if isinstance(value, Iterable) else value) for name, value in sorted(settings.items())
        )
        hash(grouped)
        return grouped
    except (TypeError, AttributeError):
        return tuple(settings)


def _canonical(value: Any) -> Any:
    """``value`` with the values Python takes as equal written alike (True and 1, 0.0 and 0)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, (list, tuple)):
        return [_canonical(item) for item in value]
    return value


class Groups:
    """Every group of one evaluation, in order of first appearance (guarded by its probe's lock)."""

    def __init__(self, min_samples: int = 16, length_ratio: float = 0.75) -> None:
        self._min_samples, self._length_ratio = min_samples, length_ratio
        self._by_key: dict[str, Group] = {}
        self.first_request_at: float | None = None

    def __iter__(self):  # type: ignore[no-untyped-def]
        """The groups that made requests (one only told of, by ``expect``, is not yet one)."""
        return iter([group for group in self._by_key.values() if group.next_place])

    def expect(self, key: str, settings: dict[str, Any], generations: int) -> None:
        """lm-eval will ask the group of ``key`` for ``generations`` (its sample then knows its end)."""
        self._group(key, settings).sample.expect(generations)

    def get(self, gen_kwargs: Any) -> Group:
        """The group of ``gen_kwargs``, made on first sight."""
        key, settings = group_key(gen_kwargs)
        if self.first_request_at is None:
            self.first_request_at = time.time()
        return self._group(key, settings)

    def _group(self, key: str, settings: dict[str, Any]) -> Group:
        group = self._by_key.get(key)
        if group is None:
            group = self._by_key[key] = Group(key, settings, Sample(self._min_samples, self._length_ratio))
        return group
