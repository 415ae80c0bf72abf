"""Marking the probe's blank answers in the samples lm-eval logs (``--log_samples``).

lm-eval writes a blank as ``""``, like a model's own empty answer, so each logged sample with a
blank among its answers gets one more key, ``EVIDENCE_KEY``: how many of its answers the probe
made up (a blank answer). lm-eval's readers ignore a key they do not know; a sample without it holds only the
model's answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from probe.runtime.core.answers import BlankAnswer
from probe.runtime.core.contract import EVIDENCE_KEY

WHY = "the probe tripped and answered these with an empty string; they are not the model's answers"


def _answers(resps: Any) -> Iterator[Any]:
    """Every answer in a sample's ``resps`` (a list per request, each a list of answers)."""
    for resp in resps if isinstance(resps, (list, tuple)) else ():
        yield from resp if isinstance(resp, (list, tuple)) else (resp,)


def mark_blanks(results: Any) -> int:
    """Mark every logged sample of ``results`` (as ``evaluate`` returns them) that holds a blank;
    returns how many were marked."""
    samples = results.get("samples") if isinstance(results, dict) else None
    marked = 0
    for logged in samples.values() if isinstance(samples, dict) else ():
        for sample in logged if isinstance(logged, list) else ():
            answers = list(_answers(sample.get("resps"))) if isinstance(sample, dict) else []
            blank = sum(isinstance(answer, BlankAnswer) for answer in answers)
            if blank:
                sample[EVIDENCE_KEY] = {"blank_answers": blank, "answers": len(answers), "why": WHY}
                marked += 1
    return marked
