"""lm-eval's request order, replaced by a seeded sample order where the gate cannot choose:
invasive patches of the ``Collator`` that lm-eval's API models and vLLM backend sort with.

Each sends a group's requests in the order ``Collator`` gives them, longest prompt first: the
sync path one request at a time, vLLM to an engine that serves the first ones first, and
every path with ``batch_size > 1`` puts neighbouring prompts in one request, so the first
observations would be the longest prompts', or blocks of alike ones. While
:func:`sampled_order` is in effect (on this thread or task), a ``Collator`` made by the
patched module sorts by a seeded hash of each request's prompt instead
(``sampling.rank``): a uniform random order, reproducible for a given seed. ``Collator``
still puts the answers back in lm-eval's order, so no answer moves, and none changes.

With ``whole_batches`` (lm-eval's Hugging Face backend, where which prompts share a batch
decides their padding, and in bfloat16 their answers) the sort is left alone: lm-eval makes
its batches as it always does, ``batch_fn`` and all, and they run in a seeded order of whole
batches instead (:func:`batch_order`), their answers put back before ``get_original``.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from probe.runtime.log import say
from probe.runtime.patching import MARKER, mark, wrap
from probe.runtime.sampling import rank

# (seed, whole batches) in a sampled_order block; None outside one.
_SEED: contextvars.ContextVar[tuple[int, bool] | None] = contextvars.ContextVar(
    "lm_eval_probe_sampled_order", default=None
)


@contextmanager
def sampled_order(seed: int | None, module: Any = None, *, whole_batches: bool = False) -> Iterator[None]:
    """Collators made in the block sort by ``seed`` (None: as lm-eval says), or with
    ``whole_batches`` keep lm-eval's batches and run them in an order drawn from ``seed``.
    With a seed, ``module.Collator`` is patched first if it is not ours: a pipeline may have
    replaced it after the probe installed, and its requests would go in lm-eval's order again."""
    if seed is not None and module is not None:
        install_order(module)
    token = _SEED.set(None if seed is None else (seed, whole_batches))
    try:
        yield
    finally:
        _SEED.reset(token)


def _sample_key(seed: int, request: Any, copy: int = 0) -> int:
    # lm-eval's requests are (prompt, gen_kwargs, ...) tuples; the prompt alone decides, so the
    # order does not depend on the order lm-eval passed them in.
    prompt = request[0] if isinstance(request, tuple) and request else request
    return rank(seed, f"{prompt!r}\0{copy}" if copy else repr(prompt))


def _sample_sort(seed: int) -> Callable[[Any], int]:
    """A ``sort_fn`` in the sampled order. The n-th copy of a prompt (lm-eval's ``repeats``
    pass one prompt many times) gets a key of its own: keyed by the prompt alone, the copies
    sort next to each other, and the first observations are one prompt many times over."""
    copies: dict[str, int] = {}

    def key(request: Any) -> int:
        prompt = repr(request[0] if isinstance(request, tuple) and request else request)
        copy = copies[prompt] = copies.get(prompt, -1) + 1
        return _sample_key(seed, request, copy)

    return key


def batch_order(seed: int, batches: Sequence[Sequence[Any]]) -> list[int]:
    """The order to run ``batches`` in (their indices): by a seeded key of each batch's first
    request, drawn independently of the batch's size, so a uniform random permutation of the
    batches. With one request a batch it is the order that sorting by ``_sample_sort`` gives."""
    key = _sample_sort(seed)
    keys = [key(batch[0]) if batch else 0 for batch in batches]
    return sorted(range(len(batches)), key=keys.__getitem__)


@dataclass
class BatchOrder:
    """One Collator's batches run in the seeded order, and its answers put back in lm-eval's."""

    seed: int
    positions: list[int] = field(default_factory=list)  # lm-eval's index of each request run, in the order run

    def run(self, batches: Iterable[list]) -> Iterator[list]:
        made = list(batches)  # lm-eval's batches, made in its own order (batch_fn sees that order)
        try:
            order = batch_order(self.seed, made)
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
    if order is None or not order[1]:
        return collator
    batches = BatchOrder(order[0])
    get_batched, get_original = collator.get_batched, collator.get_original
    try:
        collator.get_original = lambda answers: get_original(batches.restore(answers))
        collator.get_batched = lambda *args, **kwargs: batches.run(get_batched(*args, **kwargs))
    except Exception as error:
        say(f"cannot order the batches of {type(collator).__name__} ({error!r}); they run in lm-eval's order")
    return collator


def _sorted_by_sample(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A ``Collator``'s arguments with its ``sort_fn`` (first after ``arr``) replaced, in a
    block that sorts (not one of whole batches)."""
    order = _SEED.get()
    if order is None or order[1]:
        return args, kwargs
    key = _sample_sort(order[0])
    if args:
        return (key, *args[1:]), kwargs
    return args, {**kwargs, "sort_fn": key}


def sampled_collator(original: Any) -> Any:
    """lm-eval's ``Collator`` (or whatever a pipeline replaced it with) sorting in the sampled
    order when asked to: a subclass of a class, a wrapper of any other callable."""
    if not isinstance(original, type):

        def collator(arr: Any, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = _sorted_by_sample(args, kwargs)
            return _in_batch_order(original(arr, *args, **kwargs))

        return mark(collator, original)

    class Collator(original):  # type: ignore[misc, valid-type]
        def __init__(self, arr: Any, *args: Any, **kwargs: Any) -> None:
            args, kwargs = _sorted_by_sample(args, kwargs)
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
