"""The probe body: the code that runs inside lm-eval and ends max-token non-termination.

This module is injected verbatim into ``sitecustomize.py`` files of environments where
lm-eval-probe is not installed, so it imports the standard library only (lm-eval is
reached through the classes handed to :func:`install`). The start-up stub in
``probe/bootstrap.py`` compiles it lazily, when lm-eval's API models are first imported.

Layout: the contract (names, knobs), then pure logic (knob parsing, evidence, trip
rule, sidecar document), then the glue that patches lm-eval.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import hashlib
import inspect
import json
import math
import os
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# --------------------------------------------------------------------------- contract

PROBE_VERSION = "0.1.0"
SIDECAR_NAME = "hyperloom_eval_probe.json"
SCHEMA_VERSION = 1
PATHOLOGY = "non_terminating"
ENV_SWITCH = "HYPERLOOM_EVAL_PROBE"
ENV_MIN_SAMPLES = "HYPERLOOM_EVAL_PROBE_MIN_SAMPLES"
ENV_LENGTH_RATIO = "HYPERLOOM_EVAL_PROBE_LENGTH_RATIO"
ENV_MIN_MAX_TOKENS = "HYPERLOOM_EVAL_PROBE_MIN_MAX_TOKENS"
RESULT_DIR_VARS = ("RESULT_DIR", "EVAL_RESULT_DIR")
# Set by `eval-probe run`: where to write, at exit, what the probe observed (tripped or not).
ENV_REPORT = "HYPERLOOM_EVAL_PROBE_REPORT"
OFF_VALUES = ("0", "false", "off", "no")
ON_VALUES = ("", "1", "true", "on", "yes")
# finish_reason values that mean "the model did not choose to stop".
PATHOLOGICAL_REASONS = ("length", "repetition")
USAGE_AT_CAP = "usage_at_cap"
USAGE_BELOW_CAP = "usage_below_cap"
MARKER = "__lm_eval_probe__"


@dataclass(frozen=True)
class Settings:
    """The effective knob values: part of the evaluation contract."""

    enabled: bool = True
    min_samples: int = 16
    length_ratio: float = 0.75
    min_max_tokens: int = 1024

    def as_dict(self) -> dict[str, Any]:
        return {
            ENV_SWITCH: self.enabled,
            ENV_MIN_SAMPLES: self.min_samples,
            ENV_LENGTH_RATIO: self.length_ratio,
            ENV_MIN_MAX_TOKENS: self.min_max_tokens,
        }


# --------------------------------------------------------------------------- knobs


def _parse_int(name: str, raw: str, default: int, minimum: int) -> tuple[int, str | None]:
    try:
        value = int(raw.strip())
    except ValueError:
        return default, f"{name}={raw!r} is not an integer; using the default {default}"
    if value < minimum:
        return default, f"{name}={raw!r} is below {minimum}; using the default {default}"
    return value, None


def _parse_ratio(name: str, raw: str, default: float) -> tuple[float, str | None]:
    try:
        value = float(raw.strip())
    except ValueError:
        return default, f"{name}={raw!r} is not a number; using the default {default}"
    if not (math.isfinite(value) and 0.0 < value <= 1.0):
        return default, f"{name}={raw!r} is not in (0, 1]; using the default {default}"
    return value, None


def _parse_switch(raw: str) -> tuple[bool, str | None]:
    text = raw.strip().lower()
    if text in OFF_VALUES:
        return False, None
    if text in ON_VALUES:
        return True, None
    return True, f"{ENV_SWITCH}={raw!r} is not one of {'/'.join(OFF_VALUES)} (off) or 1/true/on; the probe stays on"


def read_settings(environ: Mapping[str, str] | None = None) -> tuple[Settings, list[str]]:
    """Read every knob from ``environ``; bad values fall back to the default with a warning.

    Returns the effective settings and one warning per bad value. Unset knobs take their
    defaults silently.
    """
    env = os.environ if environ is None else environ
    defaults = Settings()
    warnings: list[str] = []

    def pick(name: str, parse: Callable[[str], tuple[Any, str | None]], default: Any) -> Any:
        raw = env.get(name)
        if raw is None:
            return default
        value, warning = parse(raw)
        if warning:
            warnings.append(warning)
        return value

    settings = Settings(
        enabled=pick(ENV_SWITCH, _parse_switch, True),
        min_samples=pick(
            ENV_MIN_SAMPLES,
            lambda raw: _parse_int(ENV_MIN_SAMPLES, raw, defaults.min_samples, 1),
            defaults.min_samples,
        ),
        length_ratio=pick(
            ENV_LENGTH_RATIO,
            lambda raw: _parse_ratio(ENV_LENGTH_RATIO, raw, defaults.length_ratio),
            defaults.length_ratio,
        ),
        min_max_tokens=pick(
            ENV_MIN_MAX_TOKENS,
            lambda raw: _parse_int(ENV_MIN_MAX_TOKENS, raw, defaults.min_max_tokens, 0),
            defaults.min_max_tokens,
        ),
    )
    return settings, warnings


def settings_fingerprint(settings: Settings) -> str:
    """A stable short hash of the effective settings: equal iff the settings are equal."""
    canonical = json.dumps(settings.as_dict(), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


# --------------------------------------------------------------------------- evidence


def classify_response(response: Any, max_tokens: int) -> list[str]:
    """One label per well-formed choice of an OpenAI-style response; [] if none is.

    A label is the choice's ``finish_reason`` when it is a string; when it is absent,
    ``usage.completion_tokens`` decides between ``usage_at_cap`` and ``usage_below_cap``
    (shared evenly among the choices). Anything malformed yields no label.
    """
    if not isinstance(response, Mapping):
        return []
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return []
    labels: list[str] = []
    for choice in choices:
        if not isinstance(choice, Mapping):
            continue
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            labels.append(reason)
        elif reason is None:
            label = _usage_label(response.get("usage"), max_tokens, len(choices))
            if label:
                labels.append(label)
    return labels


def _usage_label(usage: Any, max_tokens: int, n_choices: int) -> str | None:
    if not isinstance(usage, Mapping):
        return None
    tokens = usage.get("completion_tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        return None
    return USAGE_AT_CAP if tokens >= max_tokens * n_choices else USAGE_BELOW_CAP


def is_pathological(label: str) -> bool:
    """True for a generation that ended without the model choosing to stop."""
    return label in PATHOLOGICAL_REASONS or label == USAGE_AT_CAP


def rule_fires(observed: int, pathological: int, min_samples: int, length_ratio: float) -> bool:
    """The trip rule: enough observations, and enough of them pathological."""
    if observed < min_samples or observed <= 0:
        return False
    # A small tolerance so that, say, 7 of 10 meets a ratio of 0.7 despite float rounding.
    return pathological >= length_ratio * observed - 1e-9


@dataclass
class Tally:
    """Evidence gathered for one group of generation requests."""

    observed: int = 0
    pathological: int = 0
    reasons: Counter = field(default_factory=Counter)
    max_tokens: set = field(default_factory=set)

    def add(self, labels: list[str], max_tokens: int) -> None:
        for label in labels:
            self.observed += 1
            self.pathological += is_pathological(label)
            self.reasons[label] += 1
        if labels:
            self.max_tokens.add(max_tokens)

    def fires(self, settings: Settings) -> bool:
        return rule_fires(self.observed, self.pathological, settings.min_samples, settings.length_ratio)

    def as_dict(self) -> dict[str, Any]:
        return {
            "observations": self.observed,
            "pathological": self.pathological,
            "ratio": round(self.pathological / self.observed, 6) if self.observed else None,
            "finish_reasons": dict(sorted(self.reasons.items())),
            "repetition": self.reasons.get("repetition", 0),
            "max_tokens": sorted(self.max_tokens),
        }


# --------------------------------------------------------------------------- sidecar


def sidecar_path(environ: Mapping[str, str] | None = None) -> str:
    """Where the sidecar goes: $RESULT_DIR, else $EVAL_RESULT_DIR, else the current directory."""
    env = os.environ if environ is None else environ
    for name in RESULT_DIR_VARS:
        if env.get(name):
            return os.path.join(env[name], SIDECAR_NAME)
    return os.path.join(os.getcwd(), SIDECAR_NAME)


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


def _write_temp(path: str, document: Mapping[str, Any]) -> str:
    directory, name = os.path.split(path)
    temp = os.path.join(directory or ".", f".{name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(temp, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2, sort_keys=True)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    return temp


def write_sidecar_once(path: str, document: Mapping[str, Any]) -> bool:
    """Atomically create ``path`` with ``document`` unless it already exists.

    Returns True when this call created the file, False when another writer (a thread or
    another process) got there first. Raises OSError when the file cannot be written.
    The content is complete before the name appears: a reader never sees half a file.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)  # lm-eval itself creates it only at the end
    temp = _write_temp(path, document)
    try:
        os.link(temp, path)  # fails if path exists: first writer wins, across processes
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(temp)


def write_json_atomic(path: str, document: Mapping[str, Any]) -> None:
    """Atomically replace (or create) ``path`` with ``document`` as JSON."""
    temp = _write_temp(path, document)
    try:
        os.replace(temp, path)
    except OSError:
        os.unlink(temp)
        raise


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


# --------------------------------------------------------------------------- glue


def _say(message: str) -> None:
    """The probe's own stderr logger: no logging configuration can be assumed."""
    try:
        sys.stderr.write(f"[lm-eval-probe] {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


class ShortCircuitAnswer(str):
    """The empty answer the probe makes up; its type keeps it out of every cache."""

    __slots__ = ()


BLANK = ShortCircuitAnswer("")


class ShortCircuitedResponse(dict):
    """What the sync path's ``model_call`` returns for a short-circuited request.

    Shaped like a real response, so a parser that is not ours still reads empty answers;
    ours recognises the type and answers with :data:`BLANK` instead.
    """

    def __init__(self, n: int) -> None:
        choice = {"text": "", "message": {"content": ""}, "finish_reason": "lm_eval_probe"}
        super().__init__(choices=[{"index": i, **choice} for i in range(n)])
        self.n = n


@dataclass
class Request:
    """One generate request seen by the probe (never stored on the shared model object)."""

    group: Group
    lm: Any
    n_answers: int
    max_tokens: int
    is_evidence: bool
    observed: bool = False
    cancelled_by_probe: bool = False


@dataclass
class Group:
    """Requests that share their generation settings: lm-eval runs each group as one batch."""

    key: str
    gen_kwargs: dict[str, Any]
    tally: Tally = field(default_factory=Tally)
    tripped: bool = False
    trip_failed: bool = False
    short_circuited: int = 0
    cancelled: int = 0
    inflight: dict = field(default_factory=dict)  # task -> Request

    def summary(self) -> dict[str, Any]:
        return {
            "gen_kwargs": self.gen_kwargs,
            **self.tally.as_dict(),
            "tripped": self.tripped,
            "short_circuited_requests": self.short_circuited,
            "cancelled_in_flight": self.cancelled,
        }


_CURRENT: contextvars.ContextVar[Request | None] = contextvars.ContextVar("lm_eval_probe_request", default=None)


def _group_key(gen_kwargs: Any) -> tuple[str, dict[str, Any]]:
    settings = dict(gen_kwargs) if isinstance(gen_kwargs, Mapping) else {}
    return json.dumps(settings, sort_keys=True, default=repr), settings


def _max_tokens(lm: Any, gen_kwargs: Mapping[str, Any]) -> int | None:
    """The max_tokens lm-eval puts in the payload, computed the way lm-eval does."""
    value = gen_kwargs.get("max_tokens", gen_kwargs.get("max_gen_toks", getattr(lm, "_max_gen_toks", None)))
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


class Probe:
    """The probe's process-wide state: evidence per group, the gates, the sidecar."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started_at = time.time()
        self.first_request_at: float | None = None
        self.groups: dict[str, Group] = {}
        self.lock = threading.RLock()
        self.gates: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.sidecar: str | None = None  # the path, once this process owns the sidecar
        self.sidecar_document: dict[str, Any] | None = None
        self.reported: set[str] = set()
        self.signatures: dict[Any, inspect.Signature] = {}

    # ---- errors never reach lm-eval

    def report(self, where: str, error: BaseException) -> None:
        key = f"{where}:{type(error).__name__}"
        if key not in self.reported:
            self.reported.add(key)
            _say(f"internal error in {where}: {error!r}; lm-eval carries on unprobed there")

    # ---- requests

    def begin(self, lm: Any, original: Callable, args: tuple, kwargs: dict) -> Request | None:
        """The probe's view of a call, or None when the call is none of its business."""
        signature = self.signatures.get(original)
        if signature is None:
            signature = self.signatures[original] = inspect.signature(original)
        bound = signature.bind_partial(lm, *args, **kwargs).arguments
        generate = bound.get("generate", kwargs.get("generate", True))
        if not generate:
            return None
        extra = bound.get("kwargs", {})
        gen_kwargs = bound.get("gen_kwargs", extra.get("gen_kwargs")) or {}
        messages = bound.get("messages", extra.get("messages"))
        if messages is None:
            return None
        _hook_parser(type(lm))
        max_tokens = _max_tokens(lm, gen_kwargs)
        key, settings = _group_key(gen_kwargs)
        with self.lock:
            if self.first_request_at is None:
                self.first_request_at = time.time()
            group = self.groups.get(key)
            if group is None:
                group = self.groups[key] = Group(key, settings)
        is_evidence = max_tokens is not None and max_tokens >= self.settings.min_max_tokens
        return Request(group, lm, len(messages), max_tokens or 0, is_evidence)

    def blanks(self, request: Request) -> list[str]:
        with self.lock:
            request.group.short_circuited += 1
        return [BLANK] * request.n_answers

    def observe(self, request: Request, response: Any) -> None:
        """Record the evidence of one response, and trip when the rule fires; never raises."""
        try:
            self._record(request, response)
        except Exception as error:
            self.report("observe", error)

    def _record(self, request: Request, response: Any) -> None:
        if request.observed or not request.is_evidence:
            return
        request.observed = True
        labels = classify_response(response, request.max_tokens)
        group = request.group
        with self.lock:
            group.tally.add(labels, request.max_tokens)
            if not group.tripped and not group.trip_failed and group.tally.fires(self.settings):
                self._trip(group, request.lm)

    # ---- the trip

    def _trip(self, group: Group, lm: Any) -> None:
        path = os.path.abspath(sidecar_path())
        document = self._verdict_document(group, lm)
        try:
            where = self._claim_sidecar(path, document)
        except Exception as error:
            group.trip_failed = True
            _say(
                f"TRIP NOT APPLIED: the evidence says the model does not stop ({self._evidence(group)}), "
                f"but the sidecar {path} could not be written ({error!r}). Evaluation continues unprobed "
                "so that no unexplained zero is produced. Set RESULT_DIR to a writable directory."
            )
            return
        group.tripped = True
        _say(
            f"tripped: {self._evidence(group)} in the group {group.key}; {where}; answering this group's "
            "remaining generate requests with empty strings and cancelling those in flight"
        )
        self._cancel_inflight(group)

    def _claim_sidecar(self, path: str, document: dict[str, Any]) -> str:
        if self.sidecar is not None:
            return f"sidecar (already written by this process): {self.sidecar}"
        if write_sidecar_once(path, document):
            self._own(path, document)
            return f"sidecar: {path}"
        existing = _existing_trip_time(path)
        if existing is not None and existing < self.started_at:
            # Left by an earlier run: stale evidence must not stand in for this run's.
            # Renaming it away first keeps "first writer wins" among this run's processes.
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, f"{path}.stale-{int(existing)}")
            if write_sidecar_once(path, document):
                self._own(path, document)
                return f"sidecar: {path} (an earlier run's sidecar was renamed to {path}.stale-{int(existing)})"
        return f"sidecar already written by another process of this run: {path}"

    def _own(self, path: str, document: dict[str, Any]) -> None:
        self.sidecar = path
        self.sidecar_document = document

    def _evidence(self, group: Group) -> str:
        tally = group.tally
        caps = ",".join(str(m) for m in sorted(tally.max_tokens))
        return (
            f"{tally.pathological}/{tally.observed} generations ended without stopping "
            f"(finish reasons {dict(tally.reasons)}) at max_tokens={caps}"
        )

    def _verdict_document(self, group: Group, lm: Any) -> dict[str, Any]:
        now = time.time()
        return {
            "schema_version": SCHEMA_VERSION,
            "probe_version": PROBE_VERSION,
            "verdict": {
                "tripped": True,
                "pathology": PATHOLOGY,
                **group.tally.as_dict(),
                "group": group.gen_kwargs,
                "settings": self.settings.as_dict(),
                "settings_fingerprint": settings_fingerprint(self.settings),
                "tripped_at": now,
                "tripped_at_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now)),
                "seconds_since_first_request": round(now - (self.first_request_at or now), 3),
                "pid": os.getpid(),
                "lm_eval_version": _lm_eval_version(),
                "model": getattr(lm, "model", None) if isinstance(getattr(lm, "model", None), str) else None,
                "base_url": public_url(getattr(lm, "base_url", None)),
            },
            "final": None,
        }

    def _cancel_inflight(self, group: Group) -> None:
        try:
            current = asyncio.current_task()
        except RuntimeError:
            current = None
        for task, request in list(group.inflight.items()):
            # The request whose answer tripped the rule is still running here: its real
            # answer is kept, so it is not cancelled.
            if task is current or task.done():
                continue
            request.cancelled_by_probe = True
            task.cancel()

    def finalise(self) -> None:
        """Add the final counters to the sidecar this process wrote (once, at exit)."""
        with self.lock:
            if self.sidecar is None or self.sidecar_document is None:
                return
            groups = [g.summary() for g in self.groups.values() if g.tripped]
            document = dict(self.sidecar_document)
            document["final"] = {
                "short_circuited_requests": sum(g["short_circuited_requests"] for g in groups),
                "cancelled_in_flight": sum(g["cancelled_in_flight"] for g in groups),
                "short_circuited_groups": groups,
                "written_at": time.time(),
            }
            write_json_atomic(self.sidecar, document)
            self.sidecar_document = None

    def report_document(self) -> dict[str, Any]:
        """Everything this process observed, per group, whether or not it tripped."""
        with self.lock:
            return {
                "probe_version": PROBE_VERSION,
                "pid": os.getpid(),
                "settings": self.settings.as_dict(),
                "settings_fingerprint": settings_fingerprint(self.settings),
                "groups": [group.summary() for group in self.groups.values()],
            }

    # ---- the gate

    def gate(self, lm: Any) -> asyncio.Semaphore | None:
        """The outer gate for the running event loop (lm-eval makes a new loop per batch)."""
        size = getattr(lm, "_concurrent", None)
        if not isinstance(size, int) or size < 1:
            return None
        loop = asyncio.get_running_loop()
        with self.lock:
            gate = self.gates.get(loop)
            if gate is None:
                gate = self.gates[loop] = asyncio.Semaphore(size)
        return gate


def _existing_trip_time(path: str) -> float | None:
    try:
        value = _read_json(path)["verdict"]["tripped_at"]
    except Exception:
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _lm_eval_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("lm_eval")
    except Exception:
        return None


# --------------------------------------------------------------------------- the patches

PROBE: Probe | None = None
_ORIGINALS: list[tuple[type, str, Any]] = []  # (owner, attribute, original raw attribute)


def _mark(function: Callable, original: Any) -> Callable:
    setattr(function, MARKER, True)
    function.__wrapped__ = original  # type: ignore[attr-defined]
    return function


def _is_ours(raw: Any) -> bool:
    return getattr(getattr(raw, "__func__", raw), MARKER, False)


def _replace(owner: type, name: str, replacement: Any) -> None:
    _ORIGINALS.append((owner, name, owner.__dict__[name]))
    setattr(owner, name, replacement)


def _probed_amodel_call(original: Callable) -> Callable:
    async def amodel_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe = PROBE
        request = None
        if probe is not None:
            try:
                request = probe.begin(self, original, args, kwargs)
            except Exception as error:
                probe.report("amodel_call", error)
        if request is None:
            return await original(self, *args, **kwargs)
        return await _run_async(probe, request, original, self, args, kwargs)

    return _mark(amodel_call, original)


async def _run_async(probe: Probe, request: Request, original: Callable, lm: Any, args: tuple, kwargs: dict) -> Any:
    group = request.group
    if group.tripped:
        return probe.blanks(request)
    try:
        gate = probe.gate(lm)
    except Exception as error:
        probe.report("gate", error)
        gate = None
    if gate is not None:
        await gate.acquire()
    try:
        if group.tripped:  # tripped while this request waited at the gate
            return probe.blanks(request)
        token = _CURRENT.set(request)
        try:
            inner = asyncio.ensure_future(original(lm, *args, **kwargs))
        finally:
            _CURRENT.reset(token)
        group.inflight[inner] = request
        try:
            await asyncio.wait({inner})
        except asyncio.CancelledError:
            inner.cancel()
            raise
        finally:
            group.inflight.pop(inner, None)
        if request.cancelled_by_probe and (inner.cancelled() or inner.exception() is not None):
            with probe.lock:
                group.cancelled += 1
            return probe.blanks(request)
        return inner.result()
    finally:
        if gate is not None:
            gate.release()


def _probed_model_call(original: Callable) -> Callable:
    def model_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe = PROBE
        request = None
        if probe is not None:
            try:
                request = probe.begin(self, original, args, kwargs)
                if request is not None and request.group.tripped:
                    probe.blanks(request)
                    return ShortCircuitedResponse(request.n_answers)
            except Exception as error:
                probe.report("model_call", error)
                request = None
        outputs = original(self, *args, **kwargs)
        if request is not None:
            probe.observe(request, outputs)
        return outputs

    return _mark(model_call, original)


def _observing_parser(original: Callable, is_static: bool) -> Callable:
    position = 0 if is_static else 1

    def parse_generations(*args: Any, **kwargs: Any) -> Any:
        outputs = kwargs["outputs"] if "outputs" in kwargs else args[position] if len(args) > position else None
        if isinstance(outputs, ShortCircuitedResponse):
            return [BLANK] * outputs.n
        answers = original(*args, **kwargs)
        request = _CURRENT.get()
        probe = PROBE
        if request is not None and probe is not None:
            probe.observe(request, outputs)
        return answers

    return _mark(parse_generations, original)


def _hook_parser(cls: type) -> None:
    """Make sure ``cls.parse_generations`` observes responses.

    Checked on every request rather than once, so that a pipeline which replaces the
    parser after the probe installed (with a static or an instance method) is observed
    too. The raw attribute is fetched from the defining class's ``__dict__`` along the
    MRO, because ``getattr`` would unwrap a staticmethod and lose what kind it was.
    """
    for owner in cls.__mro__:
        raw = owner.__dict__.get("parse_generations")
        if raw is None:
            continue
        if _is_ours(raw):
            return
        if isinstance(raw, staticmethod):
            _replace(owner, "parse_generations", staticmethod(_observing_parser(raw.__func__, True)))
        elif inspect.isfunction(raw):
            _replace(owner, "parse_generations", _observing_parser(raw, False))
        return


def _guarded_add_partial(original: Callable) -> Callable:
    def add_partial(self: Any, attr: str, req: Any, res: Any) -> Any:
        if isinstance(res, ShortCircuitAnswer):
            return None  # a made-up answer must never be replayed as model output
        return original(self, attr, req, res)

    return _mark(add_partial, original)


class _CacheGuard:
    """Wraps CachingLM's SQLite dict so that made-up answers are never stored in it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(value, ShortCircuitAnswer):
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
        if dbdict is not None and not isinstance(dbdict, _CacheGuard):
            self.dbdict = _CacheGuard(dbdict)

    return _mark(__init__, original)


def _patch(owner: type, name: str, make: Callable[[Callable], Callable]) -> None:
    raw = owner.__dict__.get(name)
    if raw is not None and not _is_ours(raw):
        _replace(owner, name, make(raw))


def install(api_models: Any = None) -> bool:
    """Patch lm-eval's API models; True when the probe is active afterwards.

    Idempotent: a second call (the body appended twice, or loaded two ways) patches
    nothing more. Never raises: an error is reported once and lm-eval runs unprobed.
    """
    global PROBE
    try:
        settings, warnings = read_settings()
        for warning in warnings:
            _say(warning)
        if not settings.enabled:
            return False
        if api_models is None:
            import lm_eval.models.api_models as api_models
        from lm_eval.api import model as api_model

        template = api_models.TemplateAPI
        if _is_ours(template.__dict__.get("amodel_call")):
            return True
        if PROBE is None:
            PROBE = Probe(settings)
            atexit.register(_finalise_at_exit)
        _patch(template, "amodel_call", _probed_amodel_call)
        _patch(template, "model_call", _probed_model_call)
        _patch(api_model.CacheHook, "add_partial", _guarded_add_partial)
        _patch(api_model.CachingLM, "__init__", _guarded_caching_init)
        return True
    except Exception as error:
        _say(f"could not install ({error!r}); lm-eval runs unprobed")
        uninstall()
        return False


class _InstallingLoader:
    """Runs the real loader of lm-eval's API module, then installs the probe on it."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        install(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def installing_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
    """The real spec of lm-eval's API module, whose loader installs the probe after it ran.

    Called by the start-up stub's finder, which has already taken itself off
    ``sys.meta_path``, so the finders asked here are the real ones.
    """
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(fullname, path, target) if find is not None else None
        if spec is not None:
            if spec.loader is not None:
                spec.loader = _InstallingLoader(spec.loader)
            return spec
    return None


def uninstall() -> None:
    """Restore every original that is still replaced by our wrapper, newest first."""
    global PROBE
    while _ORIGINALS:
        owner, name, original = _ORIGINALS.pop()
        if _is_ours(owner.__dict__.get(name)):
            setattr(owner, name, original)
    PROBE = None


def _finalise_at_exit() -> None:
    probe = PROBE
    if probe is None:
        return
    try:
        probe.finalise()
    except Exception as error:
        _say(f"could not add the final counters to the sidecar: {error!r}")
    report = os.environ.get(ENV_REPORT)
    if report:
        try:
            write_json_atomic(report, probe.report_document())
        except Exception as error:
            _say(f"could not write the observation report {report}: {error!r}")
