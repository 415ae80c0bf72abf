"""Replacing attributes of lm-eval's classes: originals kept reachable, idempotent, undoable."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from types import FunctionType
from typing import Any

MARKER = "__lm_eval_probe__"
# Each wrapper names itself here: functools.wraps copies a wrapper's __dict__ (the marker with it)
# onto a pipeline's function that wraps it, which names another.
_SELF = "__lm_eval_probe_self__"
# (owner, attribute, original raw attribute), oldest first: undone newest first.
_ORIGINALS: list[tuple[type, str, Any]] = []
# The replacements the running ``own_replacements`` block of this thread made (None: none runs).
_OWN = threading.local()


def mark(function: Callable, original: Any) -> Callable:
    """Tag ``function`` as the probe's wrapper of ``original`` (kept as ``__wrapped__``)."""
    setattr(function, MARKER, True)
    setattr(function, _SELF, function)
    function.__wrapped__ = original  # type: ignore[attr-defined]
    return function


def is_ours(raw: Any) -> bool:
    """Whether a raw attribute (function, staticmethod, class, ...) is one of our wrappers.

    A class is ours only when it carries the marker itself: a pipeline's subclass of one of
    our classes inherits the attribute, and is theirs. A function is ours only when it names
    itself (``mark``): a pipeline's function made with functools.wraps around one of ours
    carries our marker, and is theirs. Any other object is ours when its class is.
    """
    if isinstance(raw, type):
        return bool(raw.__dict__.get(MARKER, False))
    target = getattr(raw, "__func__", raw)
    if isinstance(target, FunctionType):
        return getattr(target, _SELF, None) is target
    return bool(type(target).__dict__.get(MARKER, False))


def is_ours_within(raw: Any) -> bool:
    """Whether ``raw`` or anything in its ``__wrapped__`` chain is one of our wrappers.

    A pipeline may wrap ours after the probe installed; ours then still works inside it.
    Wrapping again would run the probe twice a call.
    """
    for _ in range(64):  # a chain that long, or a cycle, is no one's
        if raw is None:
            return False
        if is_ours(raw):
            return True
        raw = getattr(getattr(raw, "__func__", raw), "__wrapped__", None)
    return False


def replace(owner: type, name: str, replacement: Any) -> None:
    """Set ``owner.name`` to ``replacement``, remembering the raw original for :func:`restore_all`."""
    entry = (owner, name, owner.__dict__[name])
    _ORIGINALS.append(entry)
    made = getattr(_OWN, "made", None)
    if made is not None:
        made.append(entry)
    setattr(owner, name, replacement)


def wrap(owner: type, name: str, make: Callable[[Callable], Callable]) -> None:
    """Replace ``owner.name`` by ``make(original)`` unless it is absent or already ours (or wraps ours)."""
    raw = owner.__dict__.get(name)
    if raw is not None and not is_ours_within(raw):
        replace(owner, name, make(raw))


@contextlib.contextmanager
def own_replacements() -> Iterator[list[tuple[type, str, Any]]]:
    """The replacements this thread makes inside the block, for :func:`restore_own`: an install
    that fails half-way undoes its own work, never an earlier install's nor another thread's."""
    made: list[tuple[type, str, Any]] = []
    outer = getattr(_OWN, "made", None)
    _OWN.made = made
    try:
        yield made
    finally:
        _OWN.made = outer


def restore_own(made: list[tuple[type, str, Any]]) -> None:
    """Restore, newest first, the replacements in ``made`` still in place (``own_replacements``)."""
    _restore([entry for entry in _ORIGINALS if any(entry is own for own in made)])


def hooks_in(module: Any) -> bool:
    """Whether anything of ``module`` (itself, or a class defined in it) is replaced now."""
    return any(owner is module or getattr(owner, "__module__", None) == module.__name__ for owner, _, _ in _ORIGINALS)


def restore_all() -> None:
    """Restore every original that is still replaced by our wrapper, newest first."""
    restore_where(lambda owner, name: True)


def restore_where(chosen: Callable[[Any, str], bool]) -> None:
    """Restore, newest first, each original whose (owner, attribute name) is ``chosen`` and
    that is still replaced by our wrapper; the others stay as they are."""
    _restore([entry for entry in _ORIGINALS if chosen(entry[0], entry[1])])


def _restore(entries: list[tuple[type, str, Any]]) -> None:
    """Forget ``entries`` (of ``_ORIGINALS``, oldest first) and, newest first, put back each original
    whose attribute is still our wrapper (a pipeline's wrapper set on top of ours stays)."""
    for entry in reversed(entries):
        _ORIGINALS[:] = [kept for kept in _ORIGINALS if kept is not entry]
        owner, name, original = entry
        if is_ours(owner.__dict__.get(name)):
            setattr(owner, name, original)
