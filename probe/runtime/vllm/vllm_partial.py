"""Partial outputs from vLLM's offline engine loop, without changing what ``LLM.generate`` returns.

For its own requests, the probe asks the engine for cumulative outputs instead of final ones only.
The engine then also reports each unfinished request, and builds the finished output unchanged.
Cumulative, not delta: a delta-mode final output holds only its last piece.
Pure logic: no vLLM import; the enum is reached through the parameters' own value.
See docs/vllm-offline.md.
"""

from __future__ import annotations

from typing import Any

# Tokens between two unfinished reports of a request: each report costs the engine a
# RequestOutput and the probe a detector update, per running request; a loop is seen within
# a few hundred tokens, so reporting every token would buy nothing.
STREAM_INTERVAL = 16
FINAL_ONLY = "FINAL_ONLY"
CUMULATIVE = "CUMULATIVE"


def watched_params(params: Any) -> tuple[Any, str | None]:
    """(a copy of ``params`` that makes the engine report cumulative outputs as it goes, None),
    or (``params`` itself, why it cannot be watched). ``params`` is never changed."""
    kind = getattr(params, "output_kind", None)
    if getattr(kind, "name", None) != FINAL_ONLY:
        return params, f"its sampling parameters ask for output kind {getattr(kind, 'name', kind)!r}, not FINAL_ONLY"
    if getattr(params, "n", 1) != 1:
        # With n > 1 vLLM gathers the n final outputs into one only in FINAL_ONLY mode.
        return params, f"n={params.n} choices per prompt"
    clone = getattr(params, "clone", None)
    members = getattr(type(kind), "__members__", {})
    if not callable(clone) or CUMULATIVE not in members:
        return params, "its sampling parameters cannot be copied with another output kind"
    copy = clone()
    copy.output_kind = members[CUMULATIVE]
    if hasattr(copy, "stream_interval") and (copy.stream_interval or 1) < STREAM_INTERVAL:
        copy.stream_interval = STREAM_INTERVAL
    return copy, None


def new_text(seen: int, text: str) -> str:
    """What cumulative ``text`` adds to the ``seen`` characters already handed on ("" when
    nothing, or when it is shorter: the engine holds back what may be a stop sequence)."""
    return text[seen:] if len(text) > seen else ""
