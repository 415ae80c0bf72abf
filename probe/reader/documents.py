"""Judging untrusted JSON from a result directory: its nesting, its numbers, its times (pure).

Everything here was written by others: lm-eval, a pipeline, a person, an attacker. Each check turns
a bad document into :class:`Unreadable`, with a reason a user can act on. It never crashes and never
returns a plausible value. See docs/reading.md.
"""

from __future__ import annotations

import json
import math
from numbers import Real
from typing import Any

# One bound for every recorded time, one depth and one refusal of duplicate keys for every
# document, the runtime's and the reader's alike.
from probe.runtime.core.sidecar import MAX_CLOCK_SKEW_S, MAX_DEPTH, DuplicateKey, nested_deeper_than, unique_keys


class Unreadable(Exception):
    """A file or document that cannot be trusted; the message says why."""


def parse_json(data: bytes, finite_only: bool = False) -> Any:
    """``data`` decoded as UTF-8 JSON nested at most MAX_DEPTH levels deep.

    An object that holds a key twice is refused (which value is meant cannot be told).
    With ``finite_only``, NaN, Infinity and numbers that overflow a float (``1e999``) are
    refused too. Raises :class:`Unreadable`, and nothing else, for any bad input.
    """
    too_deep = f"nested more than {MAX_DEPTH} levels deep"
    try:
        text = data.decode("utf-8")
        if finite_only:
            document = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                                  object_pairs_hook=unique_keys)  # fmt: skip
        else:
            document = json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey as error:
        raise Unreadable(f"not valid JSON to trust ({error})") from None
    except RecursionError:
        # Python's parser recurses once per level; a hostile file is far deeper than that.
        raise Unreadable(too_deep) from None
    except (UnicodeDecodeError, ValueError) as error:
        # ValueError also covers an integer over Python's 4300-digit int() limit.
        raise Unreadable(f"not valid JSON ({error})") from None
    if nested_deeper_than(document, MAX_DEPTH):
        raise Unreadable(too_deep)
    return document


def recorded_time(value: object, now: float, name: str) -> float:
    """``value``, a time a run recorded (seconds since the epoch), as a float.

    Raises :class:`Unreadable` when it is missing, not a number (booleans included) or not finite.
    So does a time later than ``now`` by more than MAX_CLOCK_SKEW_S: a run cannot record a time that
    has not come yet.
    """
    if value is None:
        raise Unreadable(f"{name!r} is missing or null")
    if isinstance(value, bool) or not isinstance(value, Real):
        raise Unreadable(f"{name!r} is a {type(value).__name__}, not a time in seconds")
    try:
        seconds = float(value)
    except OverflowError:  # an integer beyond a float's range
        seconds = math.inf
    if not math.isfinite(seconds):
        raise Unreadable(f"{name!r} is not a finite time")
    if seconds > now + MAX_CLOCK_SKEW_S:
        raise Unreadable(f"{name!r} is in the future ({seconds - now:.0f} s ahead of this machine's clock)")
    return seconds


def _refuse_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"non-finite number {text}")
    return value
