"""Evidence: what one response says about how its generations ended (pure)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from probe.runtime.core.contract import (
    ABORT_REASONS,
    ABORTED,
    CAUSES,
    CONTEXT_WINDOW,
    LENGTH,
    OUTPUT_CAP,
    REASONING,
    REPETITION,
)
from probe.runtime.core.sidecar import is_count

# finish_reason values that mean "the model did not choose to stop".
PATHOLOGICAL_REASONS = ("length", "repetition")
USAGE_AT_CAP = "usage_at_cap"
USAGE_BELOW_CAP = "usage_below_cap"
# finish_reason values by which servers say the model ended a generation itself (OpenAI's,
# TGI's, Anthropic-style ones): only these, and an ending read off the usage below the cap, are
# the model's own stop. Any other label says nothing of it.
STOP_REASONS = ("stop", "eos", "eos_token", "stop_sequence", "end_turn", "tool_calls", "tool_use", "function_call")
# A finish_reason becomes a key in the evidence that lm-eval's results file carries: one a
# server made up (a comma, a key a results reader looks for) is filed under OTHER_REASON.
_REASON = re.compile(r"[a-z][a-z_]{0,31}")
OTHER_REASON = "other"


@dataclass(frozen=True)
class Choice:
    """What one generation of a response says: its label, why it was cut off (None when
    the model chose to stop), and whether its answer was empty."""

    index: int
    label: str
    cause: str | None
    empty: bool

    @property
    def stop_at_cap(self) -> bool:
        """A stop reported at ``completion_tokens >= max_tokens``: a server that hides the
        cap (it reports the budget's end as a stop). Filed as cut off at the output cap."""
        return self.label in STOP_REASONS and self.cause == OUTPUT_CAP

    @property
    def rule_label(self) -> str:
        """The label the rule and the gate judge: the server's, except that any other reason at the
        cap (a stop, an unknown one) is judged as an answer at the cap (``usage_at_cap``)."""
        at_cap = self.cause in (OUTPUT_CAP, REASONING)
        return USAGE_AT_CAP if at_cap and not is_pathological(self.label) else self.label


def describe_choices(response: Any, max_tokens: int | None, fewest: int | None = None) -> list[Choice]:
    """One Choice per well-formed choice of an OpenAI-style response; [] if none is.

    A label is the choice's ``finish_reason``, else read off ``usage.completion_tokens``.
    ``max_tokens`` None is an unknown budget: then nothing is taken to be at the cap.
    ``fewest``: the smaller of two budgets the server may use (None: ``max_tokens``).
    An SGLang-native response is read as the OpenAI-style one it stands for.
    See docs/evidence.md.
    """
    if _is_sglang_native(response):
        return [
            Choice(position, found.label, found.cause, found.empty)
            for position, output in enumerate(response if isinstance(response, list) else [response])
            if isinstance(output, Mapping)
            for found in describe_choices(_openai_shaped(output), max_tokens, fewest)
        ]
    if not isinstance(response, Mapping):
        return []
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return []
    tokens = _completion_tokens(response.get("usage"))
    found: list[Choice] = []
    for position, choice in enumerate(choices):
        if not isinstance(choice, Mapping):
            continue
        reason = choice.get("finish_reason")
        if isinstance(reason, str) and reason:
            label = reason if _REASON.fullmatch(reason) else OTHER_REASON
        elif reason is None and tokens is not None and max_tokens is not None:
            label = USAGE_AT_CAP if tokens >= max_tokens * len(choices) else USAGE_BELOW_CAP
        else:
            continue
        index = choice.get("index")
        index = index if isinstance(index, int) and not isinstance(index, bool) else position
        own_tokens = tokens if len(choices) == 1 else None
        answer, reasoning = _texts(choice)
        cause = _cause(label, own_tokens, max_tokens, answer, reasoning, fewest)
        found.append(Choice(index, label, cause, not answer.strip()))
    return found


def _is_sglang_native(response: Any) -> bool:
    """Whether ``response`` is an SGLang ``/generate`` answer: one output, or a list (one per prompt).

    Each output holds its text and a ``meta_info``, and there are no OpenAI choices.
    A response with a list of choices is read by them, whatever a proxy added.
    A null or empty list of choices is no OpenAI answer. In a list, an output without a meta_info is read as nothing.
    """
    outputs = response if isinstance(response, list) else [response]
    return any(
        isinstance(output, Mapping)
        and "meta_info" in output
        and not (isinstance(output.get("choices"), list) and output["choices"])
        for output in outputs
    )


def _openai_shaped(output: Mapping[str, Any]) -> dict[str, Any]:
    """One SGLang output as a one-choice completions response: ``meta_info.finish_reason``
    ({"type": "stop" | "length" | "abort", ...}) is its finish reason, and its own
    ``completion_tokens`` its usage."""
    meta = output.get("meta_info")
    meta = meta if isinstance(meta, Mapping) else {}
    reason = meta.get("finish_reason")
    reason = reason.get("type") if isinstance(reason, Mapping) else reason
    choice = {"index": 0, "text": output.get("text"), "finish_reason": reason}
    return {"choices": [choice], "usage": {"completion_tokens": meta.get("completion_tokens")}}


def classify_response(response: Any, max_tokens: int | None) -> list[str]:
    """One label per well-formed choice of an OpenAI-style response (see describe_choices)."""
    return [choice.label for choice in describe_choices(response, max_tokens)]


def _completion_tokens(usage: Any) -> int | None:
    if not isinstance(usage, Mapping):
        return None
    tokens = usage.get("completion_tokens")
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        return None
    return tokens


def _texts(choice: Mapping[str, Any]) -> tuple[str, str]:
    """(the answer text, the reasoning text) of a completions or chat choice."""
    message = choice.get("message")
    if isinstance(message, Mapping):
        answer = message.get("content")
        reasoning = message.get("reasoning_content") or message.get("reasoning")
    else:
        answer, reasoning = choice.get("text"), None
    return (answer if isinstance(answer, str) else ""), (reasoning if isinstance(reasoning, str) else "")


def _cause(
    label: str, tokens: int | None, max_tokens: int | None, answer: str, reasoning: str, fewest: int | None = None
) -> str | None:
    if label == REPETITION:
        return REPETITION
    if label in ABORT_REASONS:
        return ABORTED
    if label not in ("length", USAGE_AT_CAP) and (tokens is None or max_tokens is None or tokens < max_tokens):
        # A stop, or a reason the probe does not know ("max_tokens", "model_length"), at the budget is
        # the cap: some servers name it so (NeMo Evaluator relabels these, PR #1087). The token count
        # tells, only where it is this generation's own count.
        return None
    if not answer.strip() and reasoning.strip():
        return REASONING
    if label != "length":
        return OUTPUT_CAP
    if tokens is None or max_tokens is None:
        return LENGTH
    return OUTPUT_CAP if tokens >= (max_tokens if fewest is None else fewest) else CONTEXT_WINDOW


def is_pathological(label: str) -> bool:
    """True for a generation that ended without the model choosing to stop."""
    return label in PATHOLOGICAL_REASONS or label == USAGE_AT_CAP


def ended_by_model(label: str) -> bool:
    """Whether the model chose to end a generation so labelled (``rule_label``: a stop at the cap
    is not one). Only the stop reasons servers send count; anything else is unknown."""
    return label in STOP_REASONS or label == USAGE_BELOW_CAP


def stopped_on_its_own(choice: Choice) -> bool:
    """A generation the model ended itself, before its budget: a flag on it was false."""
    return ended_by_model(choice.label) and choice.cause is None


def _record_budget(budgets: set, max_tokens: int | tuple[int, ...] | None) -> None:
    """Keep ``max_tokens`` (one budget, or each of ``Request.budgets``) among an evidence record's budgets.

    Only a budget a reader can hold (a count) is written. A budget of 10**400 still judges its generations.
    """
    for budget in max_tokens if isinstance(max_tokens, tuple) else (max_tokens,):
        if is_count(budget):
            budgets.add(budget)


@dataclass
class TaskEvidence:
    """What one task asked for and got: every generate request counts, whatever its budget."""

    requested: int = 0  # generations lm-eval asked for
    observed: int = 0  # generations whose ending the probe saw
    reasons: Counter = field(default_factory=Counter)
    causes: Counter = field(default_factory=Counter)
    empty_answers: int = 0
    stop_at_cap: int = 0  # reported as a stop, at completion_tokens >= max_tokens (see Choice)
    short_circuited: int = 0  # answered blank by the probe, never sent
    cancelled: int = 0  # cancelled in flight by the probe, answered blank
    below_min_max_tokens: int = 0  # observed, but under the budget that counts for the rule
    unknown_budget: int = 0  # observed, under a budget the probe could not read (never judged)
    flagged: int = 0  # generations the loop detector flagged from their partial output
    flagged_endings: Counter = field(default_factory=Counter)  # how those then ended: finish reasons
    false_flags: int = 0  # flagged generations that then stopped on their own before their budget
    flagged_cut_off: int = 0  # flagged generations that then ended cut off (with a cause)
    watched: int = 0  # observed generations whose partial output the loop detector had read
    max_tokens: set = field(default_factory=set)
    groups: set = field(default_factory=set)

    def add(
        self,
        choice: Choice,
        max_tokens: int | tuple[int, ...] | None,
        is_evidence: bool,
        flagged: bool = False,
        watched: bool = False,
    ) -> None:
        """File how one generation ended (``flagged``: the loop detector had flagged it;
        ``watched``: it had read some of its output, flagged or not)."""
        if flagged:
            self.flagged_endings[choice.label] += 1
            self.false_flags += stopped_on_its_own(choice)
            self.flagged_cut_off += choice.cause is not None
        self.watched += watched or flagged
        self.observed += 1
        self.reasons[choice.label] += 1
        if choice.cause:
            self.causes[choice.cause] += 1
        self.empty_answers += choice.empty
        self.stop_at_cap += choice.stop_at_cap
        unknown = max_tokens is None or max_tokens == ()
        self.unknown_budget += unknown
        self.below_min_max_tokens += not (is_evidence or unknown)
        _record_budget(self.max_tokens, max_tokens)

    def as_dict(self, tripped: bool) -> dict[str, Any]:
        cut_off = sum(self.causes.values())
        return {
            "generate_requests": self.requested,
            "observations": self.observed,
            "finish_reasons": dict(sorted(self.reasons.items())),
            "cut_off": cut_off,
            "cut_off_rate": round(cut_off / self.observed, 6) if self.observed else None,
            "causes": {cause: self.causes.get(cause, 0) for cause in CAUSES},
            "empty_answers": self.empty_answers,
            "stop_at_cap": self.stop_at_cap,
            "short_circuited": self.short_circuited,
            "cancelled_in_flight": self.cancelled,
            "below_min_max_tokens": self.below_min_max_tokens,
            "unknown_budget": self.unknown_budget,
            "flagged": self.flagged,
            "flagged_endings": dict(sorted(self.flagged_endings.items())),
            "false_flags": self.false_flags,
            "flagged_cut_off": self.flagged_cut_off,
            "watched": self.watched,
            "max_tokens": sorted(self.max_tokens),
            "tripped": tripped,
        }


@dataclass
class Tally:
    """Evidence gathered for one group of generation requests: what the rule judges."""

    observed: int = 0
    pathological: int = 0  # cut off, for a cause the rule counts (a flag included)
    flagged: int = 0  # counted when the loop detector flagged them, before they ended
    false_flags: int = 0  # flags withdrawn: the generation then stopped on its own
    reasons: Counter = field(default_factory=Counter)
    causes: Counter = field(default_factory=Counter)
    max_tokens: set = field(default_factory=set)

    def flag(self, max_tokens: int | tuple[int, ...] | None) -> None:
        """Count a generation the loop detector flagged: pathological, cause REPETITION. Its
        ending is never counted again (its request's other choices are)."""
        self.observed += 1
        self.pathological += 1
        self.flagged += 1
        self.causes[REPETITION] += 1
        _record_budget(self.max_tokens, max_tokens)

    def withdraw(self) -> None:
        """A flagged generation stopped on its own before its budget, so its flag was false.

        It stops counting as pathological; ``add_choices`` counts its ending.
        """
        self.observed -= 1
        self.pathological -= 1
        self.flagged -= 1
        self.false_flags += 1
        self.causes[REPETITION] -= 1

    def add(self, labels: list[str], max_tokens: int | tuple[int, ...] | None) -> None:
        """Count generations known by their labels only (no cause)."""
        self.add_choices([Choice(i, label, None, False) for i, label in enumerate(labels)], max_tokens)

    def add_choices(self, choices: list[Choice], max_tokens: int | tuple[int, ...] | None) -> None:
        for choice in choices:
            self.observed += 1
            self.pathological += is_pathological(choice.rule_label)
            self.reasons[choice.label] += 1
            if choice.cause:
                self.causes[choice.cause] += 1
        if choices:
            _record_budget(self.max_tokens, max_tokens)

    def as_dict(self) -> dict[str, Any]:
        return {
            "observations": self.observed,
            "pathological": self.pathological,
            "ratio": round(self.pathological / self.observed, 6) if self.observed else None,
            "finish_reasons": dict(sorted(self.reasons.items())),
            "causes": {cause: self.causes.get(cause, 0) for cause in CAUSES},
            "repetition": self.reasons.get("repetition", 0),
            "flagged": self.flagged,
            "false_flags": self.false_flags,
            "max_tokens": sorted(self.max_tokens),
        }
