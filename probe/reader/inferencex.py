"""InferenceX's staged layout: which concurrencies a batched run asked for, and which failed.

After each lm-eval run, InferenceX moves its results into the working directory renamed
``*_conc<N>.json``, and ``meta_env.json`` lists ``eval_concs`` (asked for),
``completed_eval_concs`` and ``failed_eval_concs``.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from pathlib import Path

from probe.reader.documents import Unreadable, parse_json
from probe.reader.files import read_regular_file
from probe.runtime.core.contract import MAX_DIGITS

META_ENV = "meta_env.json"
MAX_META_BYTES = 2**20


@dataclass(frozen=True)
class Concurrencies:
    """What meta_env.json says of a batched run's concurrencies (empty when it says nothing)."""

    asked: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()


def read_meta_env(result_dir: Path) -> Concurrencies:
    """The concurrencies in ``result_dir/meta_env.json``; empty when there is no such file.

    Raises :class:`Unreadable` when the file is there but cannot be trusted.
    """
    path = Path(result_dir) / META_ENV
    if not path.exists() and not path.is_symlink():
        return Concurrencies()
    document = parse_json(read_regular_file(Path(result_dir), path, MAX_META_BYTES))
    if not isinstance(document, dict):
        raise Unreadable(f"{path} is not a JSON object")
    return Concurrencies(_numbers(document, "eval_concs", path), _numbers(document, "failed_eval_concs", path))


def _numbers(document: dict, key: str, path: Path) -> tuple[int, ...]:
    value = document.get(key, [])
    if isinstance(value, str):  # written from a shell variable: "16 32 64"
        value = value.split()
    if not isinstance(value, list):
        raise Unreadable(f"{path}: {key!r} is not a list")
    found = []
    for item in value:
        text = str(item)
        # At most MAX_DIGITS digits, as a knob's (int() refuses a string of over 4,300).
        digits = text.lstrip("0") if text.isascii() and text.isdigit() and type(item) is not bool else ""
        if not 1 <= len(digits) <= MAX_DIGITS:
            raise Unreadable(
                f"{path}: {key!r} holds {reprlib.repr(item)}, not a positive integer of at most {MAX_DIGITS} digits"
            )
        found.append(int(digits))
    return tuple(sorted(set(found)))
