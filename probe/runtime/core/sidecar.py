"""The sidecar document and how it reaches the disk: atomically, once, first writer wins."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from probe.runtime.core.contract import (
    MAX_DIGITS,
    PATHOLOGY,
    PROBE_VERSION,
    SCHEMA_VERSION,
    Settings,
    main_cause,
    settings_fingerprint,
)


def public_url(url: Any) -> str | None:
    """The URL without credentials or query string (which may hold an API key)."""
    if not isinstance(url, str):
        return None
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    host_and_path = rest.split("?", 1)[0].split("#", 1)[0]
    host, slash, path = host_and_path.partition("/")
    host = host.rsplit("@", 1)[-1]
    return f"{scheme}{sep}{host}{slash}{path}"


@dataclass(frozen=True)
class TripContext:
    """Everything a trip record says: the tripped group's figures and settings, and who
    tripped it, where, and under which knobs."""

    run_id: str
    figures: Mapping[str, Any]  # the group's Tally.as_dict()
    gen_kwargs: Mapping[str, Any]
    tasks: list[str]
    settings: Settings
    first_request_at: float | None
    lm_eval_version: str | None
    model: str | None
    base_url: str | None  # already without credentials
    backend: str = "api"  # "api" (a server) or "vllm" (the in-process engine of --model vllm)


def trip_document(trip: TripContext) -> dict[str, Any]:
    """The sidecar as written at the trip: the trip record, and ``final`` still null.

    ``cause`` names the cause the rule counted most (see the glossary in ``contract``):
    ``pathology`` keeps its one schema value for every cause.
    """
    now = time.time()
    return {
        "schema_version": SCHEMA_VERSION,
        "probe_version": PROBE_VERSION,
        "verdict": {
            "tripped": True,
            "pathology": PATHOLOGY,
            "cause": main_cause(trip.figures.get("causes") or {}),
            "run_id": trip.run_id,
            **trip.figures,
            "group": dict(trip.gen_kwargs),
            "tasks": trip.tasks,
            "settings": trip.settings.as_dict(),
            "settings_fingerprint": settings_fingerprint(trip.settings),
            "tripped_at": now,
            "tripped_at_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
            "seconds_since_first_request": round(now - (trip.first_request_at or now), 3),
            "pid": os.getpid(),
            "lm_eval_version": trip.lm_eval_version,
            "model": trip.model,
            "base_url": trip.base_url,
            "backend": trip.backend,
        },
        "final": None,
    }


# What the runtime reads back from the result directory is bounded: a sidecar is a few KiB.
MAX_SIDECAR_BYTES = 1 << 20


def _write_temp(path: str, document: Mapping[str, Any]) -> str:
    """``document`` as JSON in a new file beside ``path``: created exclusively, under an
    unpredictable name, so a planted file or symlink is never followed or overwritten."""
    directory, name = os.path.split(path)
    handle, temp = tempfile.mkstemp(dir=directory or ".", prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=2, sort_keys=True)
            out.write("\n")
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        os.unlink(temp)
        raise
    return temp


def write_sidecar_once(path: str, document: Mapping[str, Any]) -> bool:
    """Atomically create ``path`` with ``document`` unless something already sits there.

    Returns True when this call created the file, False when anything (a file, a
    directory, a symlink, dangling or not) is already at ``path``. Raises OSError when the
    file cannot be written. The content is complete before the name appears: a reader
    never sees half a file.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)  # lm-eval itself creates it only at the end
    temp = _write_temp(path, document)
    try:
        os.link(temp, path)  # fails if path exists (even as a link): first writer wins
        return True
    except FileExistsError:
        return False
    except OSError as error:
        if error.errno not in NO_HARD_LINKS:
            raise
    finally:
        os.unlink(temp)
    return _create_exclusively(path, document)


# A file system without hard links (some network and FUSE mounts) answers os.link so.
NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV, errno.EMLINK}


def _create_exclusively(path: str, document: Mapping[str, Any]) -> bool:
    """The fallback where hard links do not work: create ``path`` exclusively (never through
    a link) and write it there; a reader may see it half-written for a moment."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(document, out, indent=2, sort_keys=True)
        out.write("\n")
        out.flush()
        os.fsync(out.fileno())
    return True


def write_json_atomic(path: str, document: Mapping[str, Any]) -> None:
    """Atomically replace (or create) ``path`` with ``document`` as JSON."""
    temp = _write_temp(path, document)
    try:
        os.replace(temp, path)
    except OSError:
        os.unlink(temp)
        raise


def read_sidecar_at(path: str) -> tuple[dict[str, Any] | None, str]:
    """The sidecar document at ``path`` and "", or None and what sits there instead.

    Never follows a symlink, never blocks on a FIFO or a device, never reads more than
    MAX_SIDECAR_BYTES, never raises: anything but a regular file holding a sidecar of the
    supported schema comes back as None with a reason ("absent" when nothing is there).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None, "absent"
    except OSError as error:
        kind = "a symlink" if os.path.islink(path) else f"something that cannot be opened ({error.strerror})"
        return None, kind
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "a directory" if stat.S_ISDIR(info.st_mode) else "a special file (not a regular file)"
        if info.st_size > MAX_SIDECAR_BYTES:
            return None, f"a file of {info.st_size} bytes (a sidecar is at most {MAX_SIDECAR_BYTES})"
        raw = os.read(fd, MAX_SIDECAR_BYTES + 1)
    except OSError as error:
        return None, f"a file that cannot be read ({error.strerror})"
    finally:
        os.close(fd)
    try:
        document = json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys)
    except DuplicateKey as error:
        return None, f"a file that is not valid JSON ({error})"
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, "a file that is not valid JSON"
    problem = trip_record_problem(document)
    return (None, problem) if problem else (document, "")


# How far in the future a recorded time may lie: the clocks of two hosts differ a little.
MAX_CLOCK_SKEW_S = 300.0
# Deeper than anything lm-eval or the probe writes (a results file nests about 6 levels),
# and far from Python's recursion limit, so that walking a document that passed is safe.
MAX_DEPTH = 64


class DuplicateKey(ValueError):
    """A JSON object that holds one key twice: which value is meant cannot be told."""


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``'s ``object_pairs_hook`` for files others wrote: a key held twice raises DuplicateKey.

    Python would silently keep the last value, so a tripped record could read as a healthy one.
    """
    document = dict(pairs)
    if len(document) == len(pairs):
        return document
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise DuplicateKey(f"duplicate key {key!r} in one object: which of its values is meant cannot be told")
        seen.add(key)
    return document  # unreachable: fewer keys than pairs means one came twice


def nested_deeper_than(document: Any, limit: int) -> bool:
    """Whether parsed JSON nests deeper than ``limit`` levels. Iterative: it never recurses."""
    pending = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, (dict, list)):
            if depth > limit:
                return True
            children = value.values() if isinstance(value, dict) else value
            pending.extend((child, depth + 1) for child in children)
    return False


# The trip record's fields and their types: what the runtime writes (trip_document) and what
# any reader of a sidecar may rely on. bool is refused where an int is meant (True == 1).
TRIP_RECORD_FIELDS: dict[str, type | tuple[type, ...]] = {
    "tripped": bool,
    "pathology": str,
    "observations": int,
    "pathological": int,
    "finish_reasons": dict,
    "max_tokens": list,
    "settings": dict,
    "tripped_at": (int, float),
}


def trip_record_problem(document: Any, now: float | None = None) -> str | None:
    """Why ``document`` is not a sidecar to trust, or None when it is.

    This is the one definition of a valid sidecar, for the runtime and the reader alike.
    With ``now``, a ``tripped_at`` too far in the future is refused too.
    See docs/sidecar.md.
    """
    if not isinstance(document, dict):
        return "a JSON document that is not an object"
    if nested_deeper_than(document, MAX_DEPTH):
        return f"a sidecar nested more than {MAX_DEPTH} levels deep"
    version = document.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        return f"schema_version {version!r} is not the supported {SCHEMA_VERSION}"
    record = document.get("verdict")
    if not isinstance(record, dict):
        return "a sidecar without a trip record ('verdict' object)"
    for name, kind in TRIP_RECORD_FIELDS.items():
        value = record.get(name)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            return f"a trip record whose field {name!r} is missing or of the wrong type"
    problem = _counts_problem(record) or _optional_fields_problem(record)
    if problem:
        return problem
    final = document.get("final")
    if final is not None and not isinstance(final, dict):
        return "a sidecar whose 'final' is neither null nor an object"
    problem = _final_problem(final or {})
    if problem:
        return problem
    if not finite_throughout(document):
        return "a sidecar holding a number that is not finite (NaN, Infinity, or beyond a float)"
    if now is not None and record["tripped_at"] > now + MAX_CLOCK_SKEW_S:
        return f"a trip record in the future ('tripped_at' {record['tripped_at'] - now:.0f} s ahead of this clock)"
    return None


def json_safe(value: Any, depth: int = 0) -> Any:
    """``value`` (such as a group's generation settings) as JSON every reader holds.

    Mappings (keys as strings) and lists are copied so.
    Strings, booleans, None, integers of at most MAX_DIGITS digits and finite floats are kept.
    Anything else becomes its repr: NaN, infinities, longer integers, non-JSON types, nesting past MAX_DEPTH.
    """
    if isinstance(value, (str, bool)) or value is None:
        return value
    if type(value) is int and abs(value) < 10**MAX_DIGITS:
        return value
    if type(value) is float and math.isfinite(value):
        return value
    if depth < MAX_DEPTH and isinstance(value, Mapping):
        return {str(key): json_safe(item, depth + 1) for key, item in value.items()}
    if depth < MAX_DEPTH and isinstance(value, (list, tuple)):
        return [json_safe(item, depth + 1) for item in value]
    return repr(value)


def is_count(value: Any) -> bool:
    """Whether ``value`` (parsed JSON) is a count: a non-negative integer, not a boolean.

    Like a knob, it has at most MAX_DIGITS digits, so sums of counts stay integers JSON readers hold.
    """
    return type(value) is int and 0 <= value < 10**MAX_DIGITS


def _counts_problem(record: Mapping[str, Any]) -> str | None:
    """The trip's counts as the rule keeps them (``Tally``): the pathological among the
    observations, and a finish reason for each observation that ended (a flagged one may not have)."""
    observed, pathological, reasons = record["observations"], record["pathological"], record["finish_reasons"]
    if not (is_count(observed) and is_count(pathological)) or pathological > observed:
        return "a trip record whose 'pathological' is not a count within its 'observations'"
    if not all(map(is_count, reasons.values())) or sum(reasons.values()) > observed:
        return "a trip record whose 'finish_reasons' are not counts within its 'observations'"
    return None


def _final_problem(final: Mapping[str, Any]) -> str | None:
    """What the run then blanked (``final``, written at its end): counts, those cancelled in
    flight among those answered blank."""
    counts = [final.get(name, 0) for name in ("short_circuited_requests", "cancelled_in_flight")]
    if not all(map(is_count, counts)) or counts[1] > counts[0]:
        return ("a sidecar whose 'final' counts are not counts, or count more requests cancelled in flight "
                "than answered blank")  # fmt: skip
    return None


def _optional_fields_problem(record: Mapping[str, Any]) -> str | None:
    """Fields that older records lack, refused only when present and wrong.

    ``cause`` is a word of the glossary, or null.
    ``flagged`` counts the pathological observations the loop detector flagged, within ``pathological``.
    """
    cause = record.get("cause")
    if cause is not None and not isinstance(cause, str):
        return "a trip record whose 'cause' is neither null nor a string"
    if "flagged" in record:
        flagged = record["flagged"]
        if not is_count(flagged) or flagged > record["pathological"]:
            return "a trip record whose 'flagged' is not a count within its 'pathological' observations"
    return None


def finite_throughout(document: Any) -> bool:
    """Whether ``document`` (parsed JSON) holds no NaN or infinity anywhere, nor an integer
    beyond a float's range (every reading of a time or a rate converts to float, which such an
    integer does not survive). Iterative: a hostile document may be deep, and this never recurses."""
    pending = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if type(value) is int and abs(value) > sys.float_info.max:
            return False
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return True


def record_identity(document: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    """(run_id, pid, tripped_at) of a sidecar's trip record: who wrote it, and when."""
    record = document.get("verdict") or {}
    return record.get("run_id"), record.get("pid"), record.get("tripped_at")
