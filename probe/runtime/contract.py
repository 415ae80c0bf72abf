"""The contract with the pipelines that already run the probe: names, knobs, defaults.

The ``HYPERLOOM_EVAL_PROBE*`` variables and the ``hyperloom_eval_probe.json`` sidecar name
are what they are because pipelines (InferenceX's ``benchmark_lib.sh`` and the
orchestrators that read its results) already set and read them: renaming any of them
would silently switch the probe off, or hide its evidence, in every such pipeline. The
effective knob values are part of the *evaluation contract*: runs made under different
settings carry different fingerprints, so they never look comparable.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

PROBE_VERSION = "0.1.0"
SIDECAR_NAME = "hyperloom_eval_probe.json"
SCHEMA_VERSION = 1
PATHOLOGY = "non_terminating"
ENV_SWITCH = "HYPERLOOM_EVAL_PROBE"
ENV_MIN_SAMPLES = "HYPERLOOM_EVAL_PROBE_MIN_SAMPLES"
ENV_LENGTH_RATIO = "HYPERLOOM_EVAL_PROBE_LENGTH_RATIO"
ENV_MIN_MAX_TOKENS = "HYPERLOOM_EVAL_PROBE_MIN_MAX_TOKENS"
ENV_SLOW_START = "HYPERLOOM_EVAL_PROBE_SLOW_START"
# auto: the gate decides per batch where the slow start was measured to be cheap (gate.py).
SLOW_START_MODES = ("auto", "on", "off")
RESULT_DIR_VARS = ("RESULT_DIR", "EVAL_RESULT_DIR")
# Set by `eval-probe run`: where to write, at exit, what the probe observed (tripped or not).
ENV_REPORT = "HYPERLOOM_EVAL_PROBE_REPORT"
OFF_VALUES = ("0", "false", "off", "no")
ON_VALUES = ("", "1", "true", "on", "yes")
# The lm-eval releases the test suite runs against; others get one warning, and run probed.
TESTED_LM_EVAL = ((0, 4, 9, 2), (0, 4, 13))


@dataclass(frozen=True)
class Settings:
    """The effective knob values: part of the evaluation contract."""

    enabled: bool = True
    min_samples: int = 16
    length_ratio: float = 0.75
    min_max_tokens: int = 1024
    slow_start: str = "auto"

    def as_dict(self) -> dict[str, Any]:
        return {
            ENV_SWITCH: self.enabled,
            ENV_MIN_SAMPLES: self.min_samples,
            ENV_LENGTH_RATIO: self.length_ratio,
            ENV_MIN_MAX_TOKENS: self.min_max_tokens,
            ENV_SLOW_START: self.slow_start,
        }


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


def _parse_slow_start(raw: str) -> tuple[str, str | None]:
    # The switch's own spellings are accepted too, so that "0" or "true" mean what they say.
    text = raw.strip().lower()
    if text in ("", "auto"):
        return "auto", None
    if text in OFF_VALUES:
        return "off", None
    if text in ON_VALUES:
        return "on", None
    return "auto", f"{ENV_SLOW_START}={raw!r} is not one of {'/'.join(SLOW_START_MODES)}; using the default auto"


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
        slow_start=pick(ENV_SLOW_START, _parse_slow_start, defaults.slow_start),
    )
    return settings, warnings


def settings_fingerprint(settings: Settings) -> str:
    """A stable short hash of the effective settings: equal iff the settings are equal."""
    canonical = json.dumps(settings.as_dict(), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()[:16]


def sidecar_path(environ: Mapping[str, str] | None = None) -> str:
    """Where the sidecar goes: $RESULT_DIR, else $EVAL_RESULT_DIR, else the current directory."""
    env = os.environ if environ is None else environ
    for name in RESULT_DIR_VARS:
        if env.get(name):
            return os.path.join(env[name], SIDECAR_NAME)
    return os.path.join(os.getcwd(), SIDECAR_NAME)


def version_tuple(text: str) -> tuple[int, ...] | None:
    """``"0.4.9.2"`` as ``(0, 4, 9, 2)``; None when it does not start with a number."""
    parts = []
    for piece in text.split("."):
        digits = ""
        for char in piece:
            if not ("0" <= char <= "9"):
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts) or None


def is_tested_lm_eval(version: str) -> bool:
    """Whether ``version`` lies in the range of lm-eval releases the suite runs against."""
    found = version_tuple(version)
    low, high = TESTED_LM_EVAL
    return found is not None and low <= found and found[:3] <= high
