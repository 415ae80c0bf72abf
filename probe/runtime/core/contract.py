"""The contract with the pipelines that already run the probe: names, knobs, defaults.

Pipelines already set and read these names, so they must never be renamed.
The effective knob values are part of the evaluation contract, with a fingerprint.
Runs made under different settings never look comparable.
See docs/knobs.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PROBE_VERSION = "0.1.0"
SIDECAR_NAME = "hyperloom_eval_probe.json"
# The entry the probe adds to lm-eval's results_*.json: the evidence of every task.
EVIDENCE_KEY = "hyperloom_eval_probe"
SCHEMA_VERSION = 1
PATHOLOGY = "non_terminating"
ENV_SWITCH = "HYPERLOOM_EVAL_PROBE"
ENV_MIN_SAMPLES = "HYPERLOOM_EVAL_PROBE_MIN_SAMPLES"
ENV_LENGTH_RATIO = "HYPERLOOM_EVAL_PROBE_LENGTH_RATIO"
ENV_MIN_MAX_TOKENS = "HYPERLOOM_EVAL_PROBE_MIN_MAX_TOKENS"
ENV_SLOW_START = "HYPERLOOM_EVAL_PROBE_SLOW_START"
# auto: the gate decides per batch where the slow start was measured to be cheap (gate.py).
SLOW_START_MODES = ("auto", "on", "off")
# Whether generate requests on the async API path may be streamed (the stream backend):
# auto lets it decide per request where it can reassemble the plain response with certainty.
ENV_STREAM = "HYPERLOOM_EVAL_PROBE_STREAM"
STREAM_MODES = ("auto", "on", "off")
# The loop detector on partial output (degeneration.py): its switch and thresholds.
ENV_DETECTOR = "HYPERLOOM_EVAL_PROBE_DETECTOR"
ENV_DETECTOR_NGRAM = "HYPERLOOM_EVAL_PROBE_DETECTOR_NGRAM"
ENV_DETECTOR_WINDOW = "HYPERLOOM_EVAL_PROBE_DETECTOR_WINDOW"
ENV_DETECTOR_DRIFT = "HYPERLOOM_EVAL_PROBE_DETECTOR_DRIFT"
ENV_DETECTOR_THRESHOLD = "HYPERLOOM_EVAL_PROBE_DETECTOR_THRESHOLD"
# How many periods of its cycle a generation must repeat to be flagged.
ENV_DETECTOR_REPEATS = "HYPERLOOM_EVAL_PROBE_DETECTOR_REPEATS"
DETECTOR_REPEATS_RANGE = (1, 1000)
# A drift outside this range either flags every text (0) or nothing (1).
DRIFT_RANGE = (0.05, 0.95)
# The detector's sizes, in units: they size its buffers (a size beyond what a buffer can hold
# made every detector fail), and a generation of 16,384 tokens is far shorter than the most.
DETECTOR_NGRAM_RANGE = (2, 1024)
DETECTOR_WINDOW_RANGE = (16, 1 << 20)
RESULT_DIR_VARS = ("RESULT_DIR", "EVAL_RESULT_DIR")
# Set by `eval-probe run`: where to write, at exit, what the probe observed (tripped or not).
ENV_REPORT = "HYPERLOOM_EVAL_PROBE_REPORT"
# The identity of one run, shared by its processes through the environment (see run_id()).
ENV_RUN_ID = "HYPERLOOM_EVAL_PROBE_RUN_ID"
OFF_VALUES = ("0", "false", "off", "no")
ON_VALUES = ("", "1", "true", "on", "yes")
# A ratio under one half would trip a model most of whose generations stop: not a
# non-termination verdict any more, so such values are refused.
RATIO_RANGE = (0.5, 1.0)
# ASCII only: int() and float() also accept other scripts' digits and underscores ("١٦",
# "1_6"), which a person reading the environment would not read as the same number.
_INTEGER = re.compile(r"\s*\+?[0-9]+\s*")
MAX_DIGITS = 18  # an integer knob's digits (leading zeros aside): below 2**63, as JSON readers hold it
_DECIMAL = re.compile(r"\s*\+?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\s*")
_RUN_ID = re.compile(r"[0-9a-f]{32}\.[0-9]{1,10}")

# ---------------------------------------------------------------------------------------
# Glossary: one word per concept, written once here and used by the runtime, the reader and
# every text they print.
#
# - observation: one generation whose ending the probe saw (a choice of a response).
# - evidence: an observation that counts for the rule: its request's max_tokens is at least
#   HYPERLOOM_EVAL_PROBE_MIN_MAX_TOKENS (``Request.is_evidence``). The others are counted
#   apart, as ``below_min_max_tokens`` (a budget below it) or ``unknown_budget`` (a budget the
#   probe could not read), and never judged.
# - cut off: a generation that ended without the model choosing to stop; its *cause* is one
#   of CAUSES below. The rule counts every cause in RULE_CAUSES ("pathological" in the trip
#   record's figures); an abort is the server's doing, so it is filed but never counted.
# - cap rate: cut off / observations, per task (``cut_off_rate`` in the evidence).
# - blank answer: the empty answer the probe makes up (``answers.BLANK``, a ``BlankAnswer``,
#   typed so that no cache stores it). A request answered blank is *short-circuited*: never sent, or *cancelled in
#   flight* (sent, then cancelled by the trip). A task some of whose requests were answered
#   blank was *cut short*.
# - trip: the rule fired and this evaluation's sidecar holds the trip record; a *failed
#   trip* (``Group.trip_failed``) fired but could not write it, so its group runs unprobed.
# - flagged: a generation the loop detector (``degeneration``) saw looping in its partial
#   output. The flag counts at once as a pathological outcome with cause REPETITION, and is
#   provisional: a flagged generation that then stops on its own before its budget was no loop,
#   and its flag is withdrawn (a *false flag*, ``false_flags``). How flagged generations ended is
#   filed apart (``flagged_endings``), and the observed generations whose output the detector
#   read are counted (``watched``), so that every run measures the detector's precision. A flag
#   never ends a request by itself: only a trip of its group does.
# - sample: the requests of a group that the rule judges, sent first (``rule``, ``order``).
# - budget: a request's ``max_tokens``. The slow start's count of requests it may send is its
#   *allowance*, never a budget.
# - evaluation: one ``simple_evaluate`` call, the probe's scope (``state.Probe``): its own
#   groups, evidence, run identity, sidecar and gates.
# ---------------------------------------------------------------------------------------

# The causes of a cut-off generation, as the evidence files them.
OUTPUT_CAP = "output_cap"  # ran to max_tokens: `length` at completion_tokens >= max_tokens,
# or `stop` there (a server that hides the cap reports the budget's end as a stop)
CONTEXT_WINDOW = "context_window"  # `length` below max_tokens: the server's context window
LENGTH = "length"  # `length` where the token count cannot be told (several prompts per request)
REPETITION = "repetition"  # it loops: the probe's loop detector flagged it, or vLLM's ended it
REASONING = "reasoning"  # at a cap with an empty answer while reasoning text is present
ABORTED = "aborted"  # the server ended it: an abort reason below
CAUSES = (OUTPUT_CAP, CONTEXT_WINDOW, LENGTH, REPETITION, REASONING, ABORTED)
RULE_CAUSES = (OUTPUT_CAP, CONTEXT_WINDOW, LENGTH, REPETITION, REASONING)
# finish_reason values by which a server gives up on a request (SGLang's abort, vLLM's
# error, TensorRT-LLM's timeout and cancelled): they say nothing of whether the model stops.
ABORT_REASONS = ("abort", "error", "timeout", "cancelled")

# What each cause means, in words, and what to change: the one place every text takes them
# from (the trip's stderr line, ``eval-probe run``'s summary, the reader's verdict).
_CAUSE_WORDS: dict[str, tuple[str, str]] = {
    OUTPUT_CAP: (
        "ran to the max_tokens cap",
        "the model does not stop: check its chat template, its EOS token and its weights (quantisation); "
        "raise max_tokens only if its answers are legitimately that long",
    ),
    CONTEXT_WINDOW: (
        "ran out of the server's context window before reaching max_tokens",
        "prompt plus max_tokens do not fit the server's context window (vLLM's max_model_len): raise the "
        "window, or lower max_tokens",
    ),
    LENGTH: (
        "ended at a length limit (max_tokens or the context window: batched requests do not say which)",
        "compare max_tokens with the server's context window, and check that the model stops",
    ),
    REPETITION: (
        "were seen looping (flagged by the probe's loop detector, or ended by the server's repetition detector)",
        "the model loops: check its chat template, its sampling settings and its weights",
    ),
    REASONING: (
        "spent the whole budget reasoning, with no answer",
        "raise max_tokens so that the reasoning can finish, or lower the reasoning effort",
    ),
    ABORTED: (
        "were aborted by the server",
        "read the server's log: an abort says nothing about the model",
    ),
}


def cause_words(cause: str | None) -> tuple[str, str]:
    """(what happened, what to change) for a cause of CAUSES; a neutral pair for any other."""
    return _CAUSE_WORDS.get(cause or "", ("ended without the model choosing to stop", "check that the model stops"))


def main_cause(causes: Mapping[str, Any]) -> str | None:
    """The cause the rule counted most often in ``causes`` ({cause: count}); ties go to the
    earlier one in RULE_CAUSES; None when none was counted."""
    counted = [(causes.get(c), -i, c) for i, c in enumerate(RULE_CAUSES)]
    best = max(((n, order, c) for n, order, c in counted if isinstance(n, int) and n > 0), default=None)
    return best[2] if best else None


@dataclass(frozen=True)
class Settings:
    """The effective knob values: part of the evaluation contract."""

    enabled: bool = True
    min_samples: int = 16
    length_ratio: float = 0.75
    min_max_tokens: int = 1024
    slow_start: str = "auto"
    stream: str = "auto"
    detector: bool = True
    detector_ngram: int = 10
    detector_window: int = 256
    detector_drift: float = 0.6
    detector_threshold: float = 20.0
    detector_repeats: int = 4

    def as_dict(self) -> dict[str, Any]:
        return {
            ENV_SWITCH: self.enabled,
            ENV_MIN_SAMPLES: self.min_samples,
            ENV_LENGTH_RATIO: self.length_ratio,
            ENV_MIN_MAX_TOKENS: self.min_max_tokens,
            ENV_SLOW_START: self.slow_start,
            ENV_STREAM: self.stream,
            ENV_DETECTOR: self.detector,
            ENV_DETECTOR_NGRAM: self.detector_ngram,
            ENV_DETECTOR_WINDOW: self.detector_window,
            ENV_DETECTOR_DRIFT: self.detector_drift,
            ENV_DETECTOR_THRESHOLD: self.detector_threshold,
            ENV_DETECTOR_REPEATS: self.detector_repeats,
        }


def _parse_int(name: str, raw: str, default: int, minimum: int, maximum: int | None = None) -> tuple[int, str | None]:
    if not _INTEGER.fullmatch(raw):
        return default, f"{name}={raw!r} is not an integer (ASCII digits); using the default {default}"
    digits = raw.strip().lstrip("+").lstrip("0")
    if len(digits) > MAX_DIGITS:
        # Never int() of it: past 4,300 digits that raises, unless PYTHONINTMAXSTRDIGITS lifts
        # the limit, and then the results file that records it is unreadable under the limit.
        said = f"{name}={raw.strip()[:20]}... ({len(digits)} digits)"
        return default, f"{said} is larger than any setting needs; using the default {default}"
    value = int(digits or "0")
    if value < minimum:
        return default, f"{name}={raw!r} is below {minimum}; using the default {default}"
    if maximum is not None and value > maximum:
        return default, f"{name}={raw!r} is above {maximum}; using the default {default}"
    return value, None


def _parse_ratio(
    name: str, raw: str, default: float, bounds: tuple[float, float] = RATIO_RANGE
) -> tuple[float, str | None]:
    if not _DECIMAL.fullmatch(raw):
        return default, f"{name}={raw!r} is not a decimal number; using the default {default}"
    value = float(raw.strip())
    low, high = bounds
    if not (math.isfinite(value) and low <= value <= high):
        return default, f"{name}={raw!r} is not in [{low:g}, {high:g}]; using the default {default}"
    return value, None


def _parse_positive(name: str, raw: str, default: float) -> tuple[float, str | None]:
    if not _DECIMAL.fullmatch(raw):
        return default, f"{name}={raw!r} is not a decimal number; using the default {default}"
    value = float(raw.strip())
    if not (math.isfinite(value) and value >= 1.0):
        return default, f"{name}={raw!r} is not a finite number of at least 1; using the default {default}"
    return value, None


def _parse_switch(raw: str, name: str = ENV_SWITCH, what: str = "the probe") -> tuple[bool, str | None]:
    text = raw.strip().lower()
    if text in OFF_VALUES:
        return False, None
    if text in ON_VALUES:
        return True, None
    return True, f"{name}={raw!r} is not one of {'/'.join(OFF_VALUES)} (off) or 1/true/on; {what} stays on"


def _parse_mode(name: str, raw: str) -> tuple[str, str | None]:
    """An auto/on/off knob. The switch's own spellings are accepted too, so that "0" or
    "true" mean what they say."""
    text = raw.strip().lower()
    if text in ("", "auto"):
        return "auto", None
    if text in OFF_VALUES:
        return "off", None
    if text in ON_VALUES:
        return "on", None
    return "auto", f"{name}={raw!r} is not one of auto/on/off; using the default auto"


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
        slow_start=pick(ENV_SLOW_START, lambda raw: _parse_mode(ENV_SLOW_START, raw), defaults.slow_start),
        stream=pick(ENV_STREAM, lambda raw: _parse_mode(ENV_STREAM, raw), defaults.stream),
        detector=pick(ENV_DETECTOR, lambda raw: _parse_switch(raw, ENV_DETECTOR, "the loop detector"), True),
        detector_ngram=pick(
            ENV_DETECTOR_NGRAM,
            lambda raw: _parse_int(ENV_DETECTOR_NGRAM, raw, defaults.detector_ngram, *DETECTOR_NGRAM_RANGE),
            defaults.detector_ngram,
        ),
        detector_window=pick(
            ENV_DETECTOR_WINDOW,
            lambda raw: _parse_int(ENV_DETECTOR_WINDOW, raw, defaults.detector_window, *DETECTOR_WINDOW_RANGE),
            defaults.detector_window,
        ),
        detector_drift=pick(
            ENV_DETECTOR_DRIFT,
            lambda raw: _parse_ratio(ENV_DETECTOR_DRIFT, raw, defaults.detector_drift, DRIFT_RANGE),
            defaults.detector_drift,
        ),
        detector_threshold=pick(
            ENV_DETECTOR_THRESHOLD,
            lambda raw: _parse_positive(ENV_DETECTOR_THRESHOLD, raw, defaults.detector_threshold),
            defaults.detector_threshold,
        ),
        detector_repeats=pick(
            ENV_DETECTOR_REPEATS,
            lambda raw: _parse_int(ENV_DETECTOR_REPEATS, raw, defaults.detector_repeats, *DETECTOR_REPEATS_RANGE),
            defaults.detector_repeats,
        ),
    )
    return settings, warnings


def settings_fingerprint(settings: Settings) -> str:
    """A stable short hash of the effective settings: equal iff the settings are equal."""
    canonical = json.dumps(settings.as_dict(), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def run_id(environ: dict[str, str] | None = None, fresh: bool = False) -> str:
    """This run's identity: inherited from the process that started the run, else made here.

    ``fresh`` (this process runs an evaluation) always makes one.
    An inherited identity counts only from this process or an ancestor.
    A new identity is put into ``environ`` for children. See docs/sidecar.md.
    """
    env = os.environ if environ is None else environ
    inherited = env.get(ENV_RUN_ID, "")
    if not fresh and _RUN_ID.fullmatch(inherited) and _is_ancestor_or_self(int(inherited.rsplit(".", 1)[1])):
        return inherited
    made = f"{uuid.uuid4().hex}.{os.getpid()}"
    env[ENV_RUN_ID] = made
    return made


def _is_ancestor_or_self(pid: int) -> bool:
    """Whether ``pid`` is this process or an ancestor (True where /proc cannot tell)."""
    current = os.getpid()
    for _ in range(256):  # a bound, in case /proc says something odd
        if current == pid:
            return True
        if current <= 1:
            return False
        try:
            with open(f"/proc/{current}/stat", encoding="ascii", errors="replace") as handle:
                # The command name (field 2) may hold spaces and parentheses: split after it.
                current = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False  # cannot tell (no /proc): never honour an identity that may have leaked
    return False


def sidecar_path(environ: Mapping[str, str] | None = None) -> str:
    """Where the sidecar goes: $RESULT_DIR, else $EVAL_RESULT_DIR, else the current directory."""
    env = os.environ if environ is None else environ
    for name in RESULT_DIR_VARS:
        if env.get(name):
            return os.path.join(env[name], SIDECAR_NAME)
    return os.path.join(os.getcwd(), SIDECAR_NAME)
