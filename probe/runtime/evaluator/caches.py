"""Keeping blank answers out of lm-eval's two cache layers.

``CacheHook.add_partial`` is fed inside the request paths; ``CachingLM`` writes every result
``generate_until`` returns into SQLite. An answer stored in either is replayed as model
output by a later ``--use_cache`` run, so both refuse :class:`BlankAnswer`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probe.runtime.core.answers import BlankAnswer
from probe.runtime.hooking.integration import Integration
from probe.runtime.hooking.patching import mark, restore_where, wrap
from probe.runtime.hooking.versions import LM_EVAL


def _guarded_add_partial(original: Callable) -> Callable:
    def add_partial(self: Any, attr: str, req: Any, res: Any) -> Any:
        if isinstance(res, BlankAnswer):
            return None  # a blank answer must never be replayed as model output
        return original(self, attr, req, res)

    return mark(add_partial, original)


class CacheGuard:
    """Wraps CachingLM's SQLite dict so that blank answers are never stored in it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(value, BlankAnswer):
            self._inner[key] = value

    def __getitem__(self, key: Any) -> Any:
        return self._inner[key]

    def __contains__(self, key: Any) -> bool:
        return key in self._inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _guarded_caching_init(original: Callable) -> Callable:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        dbdict = getattr(self, "dbdict", None)
        if dbdict is not None and not isinstance(dbdict, CacheGuard):
            self.dbdict = CacheGuard(dbdict)

    return mark(__init__, original)


def guard_caches(api_model: Any) -> None:
    """Patch ``lm_eval.api.model``'s CacheHook and CachingLM (idempotent)."""
    wrap(api_model.CacheHook, "add_partial", _guarded_add_partial)
    wrap(api_model.CachingLM, "__init__", _guarded_caching_init)


def unguard_caches(api_model: Any) -> None:
    """Restore what :func:`guard_caches` replaced."""
    restore_where(lambda owner, name: (owner, name) in _guarded(api_model))


def _guarded(api_model: Any) -> set[tuple[Any, str]]:
    return {(api_model.CacheHook, "add_partial"), (api_model.CachingLM, "__init__")}


# Installed with every integration that runs in lm-eval (``registry.WITH_LM_EVAL``).
INTEGRATION = Integration(
    waits_for="lm_eval.api.model",
    install=guard_caches,
    uninstall=unguard_caches,
    tested=(LM_EVAL,),
    unprobed="lm-eval's generation (its caches would keep blank answers)",
)
