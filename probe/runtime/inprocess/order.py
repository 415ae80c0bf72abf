"""lm-eval's request order with a seeded sample first: invasive patches of lm-eval's ``Collator``.

While :func:`sampled_order` is in effect, each group's seeded uniform sample is sent first.
Every other request follows in lm-eval's own order, longest prompt first.
With ``whole_batches`` (Hugging Face), a sample of lm-eval's own batches runs first instead.
Answers go back in lm-eval's order, so no answer moves, and none changes.
See docs/rule.md and docs/hf.md.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from probe.runtime.core.sampling import rank
from probe.runtime.hooking.patching import MARKER, mark, wrap
from probe.runtime.scope.groups import group_key
from probe.runtime.scope.log import say


@dataclass(frozen=True)
class _Order:
    seed: int
    reserve: int  # requests of each group sent first, as the sample
    whole_batches: bool


# The order of a sampled_order block; None outside one.
_SEED: contextvars.ContextVar[_Order | None] = contextvars.ContextVar("lm_eval_probe_sampled_order", default=None)


@contextmanager
def sampled_order(
    seed: int | None, module: Any = None, *, reserve: int = 64, whole_batches: bool = False
) -> Iterator[None]:
    """Collators made in the block send a seeded sample of ``reserve`` requests of each group first.

    With ``whole_batches``, a seeded sample of whole batches goes first. ``seed`` None keeps lm-eval's order.
    With a seed, ``module.Collator`` is patched first if it is not ours.
    A pipeline may have replaced it after the probe installed, which would restore lm-eval's order.
    """
    if seed is not None and module is not None:
        install_order(module)
    token = _SEED.set(None if seed is None else _Order(seed, reserve, whole_batches))
    try:
        yield
    finally:
        _SEED.reset(token)


def _prompt(request: Any) -> str:
    # lm-eval's requests are (prompt, gen_kwargs, ...) tuples; the prompt alone decides, so the
    # sample does not depend on the order lm-eval passed them in.
    return repr(request[0] if isinstance(request, tuple) and request else request)


def _group(request: Any) -> str:
    """The key of the generation settings in a request tuple: lm-eval's API models pass
    (prompt, gen_kwargs, encoding), its vLLM and HF backends ((prompt, encoding), gen_kwargs)."""
    items = request[1:] if isinstance(request, tuple) else ()
    settings = next((item for item in items if isinstance(item, Mapping)), None)
    return group_key(settings)[0] if settings is not None else ""


def sample_ranks(seed: int, requests: Sequence[Any]) -> list[int]:
    """A seeded rank of each request. The n-th copy of a prompt (lm-eval's ``repeats`` pass one
    prompt many times) gets a rank of its own, so copies are spread, not sent together."""
    copies: dict[str, int] = {}
    ranks = []
    for request in requests:
        prompt = _prompt(request)
        copy = copies[prompt] = copies.get(prompt, -1) + 1
        ranks.append(rank(seed, f"{prompt}\0{copy}" if copy else prompt))
    return ranks


def sample_members(seed: int, requests: Sequence[Any], reserve: int) -> set[int]:
    """The indices of the sample: in each group (its generation settings), the ``reserve``
    requests of smallest seeded rank, a uniform random subset whatever the order given."""
    return _members(sample_ranks(seed, requests), requests, reserve)


def _members(ranks: list[int], requests: Sequence[Any], reserve: int) -> set[int]:
    by_group: dict[str, list[int]] = {}
    for i, request in enumerate(requests):
        by_group.setdefault(_group(request), []).append(i)
    return {i for members in by_group.values() for i in sorted(members, key=ranks.__getitem__)[:reserve]}


def _sample_first(order: _Order, arr: Sequence[Any], original: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    """A ``sort_fn`` that puts the sample first, in seeded order, then the rest as ``original`` sorts them."""
    if not isinstance(arr, Sequence):
        raise TypeError(f"requests given as {type(arr).__name__}, not a sequence")
    ranks = sample_ranks(order.seed, arr)
    members = _members(ranks, arr, order.reserve)
    keys: dict[int, list[tuple]] = {}
    for i, request in enumerate(arr):
        keys.setdefault(id(request), []).append((0, ranks[i]) if i in members else None)

    def key(request: Any) -> tuple:
        made = keys.get(id(request))
        found = made.pop(0) if made else None
        if found is not None:
            return found
        return (1, original(request) if original is not None else 0)

    return key


def batch_order(seed: int, batches: Sequence[Sequence[Any]], reserve: int = 64) -> list[int]:
    """The order to run ``batches`` in (their indices): a seeded sample of whole batches first.

    Batches are drawn by a seeded key of their first request, whatever their size.
    The draw ends once each group has ``reserve`` requests in it; the rest follow in lm-eval's order.
    """
    keys = sample_ranks(seed, [batch[0] if batch else None for batch in batches])
    drawn: list[int] = []
    held: dict[str, int] = {}
    for b in sorted(range(len(batches)), key=keys.__getitem__):
        group = _group(batches[b][0]) if batches[b] else ""
        if held.get(group, 0) < reserve:
            held[group] = held.get(group, 0) + len(batches[b])
            drawn.append(b)
    chosen = set(drawn)
    return drawn + [b for b in range(len(batches)) if b not in chosen]


@dataclass
class BatchOrder:
    """One Collator's batches run in the seeded order, and its answers put back in lm-eval's."""

    seed: int
    reserve: int
    positions: list[int] = field(default_factory=list)  # lm-eval's index of each request run, in the order run

    def run(self, batches: Iterable[list]) -> Iterator[list]:
        made = list(batches)  # lm-eval's batches, made in its own order (batch_fn sees that order)
        try:
            order = batch_order(self.seed, made, self.reserve)
        except Exception as error:  # never break the run: lm-eval's order, said
            say(f"cannot order lm-eval's batches ({error!r}); they run in lm-eval's order")
            order = list(range(len(made)))
        starts = [0]
        for batch in made:
            starts.append(starts[-1] + len(batch))
        for b in order:
            self.positions.extend(range(starts[b], starts[b + 1]))
            yield made[b]

    def restore(self, answers: list) -> list:
        """``answers``, given in the order run, in the order lm-eval made its batches."""
        if len(answers) != len(self.positions):  # not the batches run here: as they came
            return answers
        restored = list(answers)
        for position, answer in zip(self.positions, answers, strict=True):
            restored[position] = answer
        return restored


def _in_batch_order(collator: Any) -> Any:
    """``collator``, made in a whole-batches block, running its batches in the seeded order.
    ``get_original`` is replaced first: without the new ``get_batched`` it changes nothing."""
    order = _SEED.get()
    if order is None or not order.whole_batches:
        return collator
    batches = BatchOrder(order.seed, order.reserve)
    get_batched, get_original = collator.get_batched, collator.get_original
    try:
        collator.get_original = lambda answers: get_original(batches.restore(answers))
        collator.get_batched = lambda *args, **kwargs: batches.run(get_batched(*args, **kwargs))
    except Exception as error:
        say(f"cannot order the batches of {type(collator).__name__} ({error!r}); they run in lm-eval's order")
    return collator


def _sorted_by_sample(arr: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A ``Collator``'s arguments with its ``sort_fn`` (first after ``arr``) replaced by one that
    puts the sample first, in a block that sorts (not one of whole batches)."""
    order = _SEED.get()
    if order is None or order.whole_batches:
        return args, kwargs
    try:
        original = args[0] if args else kwargs.get("sort_fn")
        key = _sample_first(order, arr, original)
    except Exception as error:  # never break the run: lm-eval's order, said
        say(f"cannot put a sample of lm-eval's requests first ({error!r}); they go in lm-eval's order")
        return args, kwargs
    if args:
        return (key, *args[1:]), kwargs
    return args, {**kwargs, "sort_fn": key}


def sampled_collator(original: Any) -> Any:
    """lm-eval's ``Collator`` (or whatever a pipeline replaced it with) sorting in the sampled
    order when asked to: a subclass of a class, a wrapper of any other callable."""
    if not isinstance(original, type):

        def collator(arr: Any, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = _sorted_by_sample(arr, args, kwargs)
            return _in_batch_order(original(arr, *args, **kwargs))

        return mark(collator, original)

    class Collator(original):  # type: ignore[misc, valid-type]
        def __init__(self, arr: Any, *args: Any, **kwargs: Any) -> None:
            args, kwargs = _sorted_by_sample(arr, args, kwargs)
            super().__init__(arr, *args, **kwargs)
            _in_batch_order(self)

    Collator.__qualname__ = Collator.__name__ = original.__name__
    Collator.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(Collator, MARKER, True)
    return Collator


def install_order(module: Any) -> None:
    """Patch ``module.Collator`` (idempotent); one line, never an exception, when it cannot be
    (then that module's requests go in lm-eval's order, and the rest of the probe works)."""
    try:
        wrap(module, "Collator", sampled_collator)
    except Exception as error:
        say(
            f"cannot put {getattr(module, '__name__', module)}'s requests in a sampled order ({error!r}); "
            "they go in lm-eval's order"
        )
