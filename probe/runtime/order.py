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
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from probe.runtime.log import say
from probe.runtime.patching import MARKER, mark, wrap
from probe.runtime.sampling import rank

_SEED: contextvars.ContextVar[int | None] = contextvars.ContextVar("lm_eval_probe_sampled_order", default=None)


@contextmanager
def sampled_order(seed: int | None, module: Any = None) -> Iterator[None]:
    """Collators made in the block sort by ``seed`` (None: as lm-eval says). With a seed,
    ``module.Collator`` is patched first if it is not ours: a pipeline may have replaced it
    after the probe installed, and its requests would go in lm-eval's order again."""
    if seed is not None and module is not None:
        install_order(module)
    token = _SEED.set(seed)
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


def _sorted_by_sample(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A ``Collator``'s arguments with its ``sort_fn`` (first after ``arr``) replaced, in the block."""
    seed = _SEED.get()
    if seed is None:
        return args, kwargs
    key = _sample_sort(seed)
    if args:
        return (key, *args[1:]), kwargs
    return args, {**kwargs, "sort_fn": key}


def sampled_collator(original: Any) -> Any:
    """lm-eval's ``Collator`` (or whatever a pipeline replaced it with) sorting in the sampled
    order when asked to: a subclass of a class, a wrapper of any other callable."""
    if not isinstance(original, type):

        def collator(arr: Any, *args: Any, **kwargs: Any) -> Any:
            args, kwargs = _sorted_by_sample(args, kwargs)
            return original(arr, *args, **kwargs)

        return mark(collator, original)

    class Collator(original):  # type: ignore[misc, valid-type]
        def __init__(self, arr: Any, *args: Any, **kwargs: Any) -> None:
            args, kwargs = _sorted_by_sample(args, kwargs)
            super().__init__(arr, *args, **kwargs)

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
