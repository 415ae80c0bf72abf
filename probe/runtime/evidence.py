"""Evidence: what one response says about how its generations ended (pure)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from probe.runtime.contract import Settings
from probe.runtime.rule import rule_fires

# finish_reason values that mean "the model did not choose to stop".
PATHOLOGICAL_REASONS = ("length", "repetition")
USAGE_AT_CAP = "usage_at_cap"
USAGE_BELOW_CAP = "usage_below_cap"


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
