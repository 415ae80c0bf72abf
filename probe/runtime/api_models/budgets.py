"""The budget an API request names (``max_tokens``; a chat request's ``max_completion_tokens``).

It is read off the payload the request is sent with, and predicted before that payload is built.
Where a chat request names two, both are returned: the probe judges by what holds under either.
A null or zero one is no budget. See docs/api.md.
"""

from __future__ import annotations

import copy
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

Budget = int | tuple[int | None, ...] | None
_KEYS = ("max_tokens", "max_completion_tokens")


def budget_in(payload: Any, chat: bool) -> Budget:
    """The budget ``payload`` names (a chat request's two, where it names two; sglang-generate's
    in its sampling_params); None where it names none this module can read (or is no dict)."""
    if not isinstance(payload, dict):
        return None
    if not chat:
        nested = payload.get("sampling_params")
        if "max_tokens" not in payload and isinstance(nested, dict):
            return _as_int(nested.get("max_new_tokens"))
        return _as_int(payload.get("max_tokens"))
    named = [payload[key] for key in _KEYS if key in payload]
    readings = [value for value in named if not (value is None or (type(value) in (int, float, bool) and value == 0))]
    if len(readings) < 2:
        return _as_int(readings[0]) if readings else None
    return _as_int(readings[0]), _as_int(readings[1])


def names_a_budget(payload: Any) -> bool:
    """Whether ``payload`` names a budget under a key this module reads."""
    if not isinstance(payload, dict):
        return False
    nested = payload.get("sampling_params")
    return any(key in payload for key in _KEYS) or (isinstance(nested, dict) and "max_new_tokens" in nested)


def predicted(lm: Any, gen_kwargs: Any, chat: bool) -> Budget:
    """The budget of a request with these settings, before its payload is built.

    It is read off the payload lm-eval's own builder makes (``_own_payload``).
    Else it is computed the way lm-eval's own models compute it.
    """
    payload = _own_payload(lm, gen_kwargs, chat)
    if payload is None:
        default = getattr(lm, "_max_gen_toks", None)
        payload = {"max_tokens": gen_kwargs.get("max_tokens", gen_kwargs.get("max_gen_toks", default))}
        if "max_completion_tokens" in gen_kwargs:
            payload["max_completion_tokens"] = gen_kwargs["max_completion_tokens"]
    return budget_in(payload, chat)


def _own_payload(lm: Any, gen_kwargs: Any, chat: bool) -> dict[str, Any] | None:
    """The payload lm-eval's own builder (``own_builder``) makes from a copy of these settings.

    Building pops the settings, hence the copy. The prompt is empty and there is no end-of-text string.
    The budget depends on neither, and reading ``eos_string`` may ask a server for its tokenizer.
    None where lm-eval has no builder for the model, the builder fails, or it names no budget.
    """
    build = own_builder(lm)
    if build is None:
        return None
    try:
        prompt: Any = [{"role": "user", "content": ""}] if chat else ""
        payload = build(
            lm, prompt, generate=True, gen_kwargs=copy.deepcopy(dict(gen_kwargs)), seed=getattr(lm, "_seed", 1234),
            eos=None,
        )  # fmt: skip
    except Exception:
        return None
    return payload if names_a_budget(payload) else None


def own_builder(lm: Any) -> Callable | None:
    """lm-eval's own ``_create_payload`` for ``lm``, as lm-eval wrote it; None where there is none.

    It is the first along the class's MRO whose code lies in lm-eval's package.
    Wrappers that keep ``__wrapped__``, the probe's own included, are unwrapped.
    Never a pipeline's own, wherever it is set: it may count, log or change what it is given.
    Run here, it would run twice.
    """
    home = _lm_eval_home()
    for cls in type(lm).__mro__:
        found = vars(cls).get("_create_payload")
        if found is None:
            continue
        try:
            function = inspect.unwrap(found)
        except ValueError:  # a cycle of __wrapped__
            continue
        code = getattr(function, "__code__", None)
        if home and code is not None and code.co_filename.startswith(home):
            return function
    return None


def _lm_eval_home() -> str:
    """The directory of the lm-eval package in this process, ending in a separator ('' if none)."""
    module = sys.modules.get("lm_eval")
    where = getattr(module, "__file__", None)
    return os.path.join(os.path.dirname(where), "") if where else ""


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return None
