"""Glue for lm-eval's evaluator: each ``simple_evaluate`` call is an evaluation with a scope
of its own (``state.begin_evaluation``), so that a sweep's second evaluation never inherits
the first one's groups, trips, run identity, sidecar or gates.

Where an evaluation starts, in every release the suite covers: ``simple_evaluate`` in
``lm_eval/evaluator.py``. Its callers look it up there when they call it: 0.4.9.2's
``__main__`` calls ``evaluator.simple_evaluate``; 0.4.12, 0.4.13 and b315ef3 (``_cli/run.py``)
run ``from lm_eval import simple_evaluate`` inside the command, which lm-eval's module
``__getattr__`` answers by importing it from ``lm_eval.evaluator`` at that moment; so does a
script's ``lm_eval.simple_evaluate(...)``. Replacing the module's attribute right after it
is imported reaches them all. Only a ``from lm_eval.evaluator import simple_evaluate`` made
before the probe installed keeps the original (that evaluation then shares the default scope).

The evaluation's evidence goes into the results it returns, under the probe's key, so the
results file saved from them carries that evaluation's evidence and no other's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probe.runtime import state
from probe.runtime.contract import EVIDENCE_KEY, read_settings
from probe.runtime.integration import Integration
from probe.runtime.log import say, say_once
from probe.runtime.patching import is_ours, mark, restore_where, wrap
from probe.runtime.versions import LM_EVAL


def _begin() -> state.Probe | None:
    """Start this evaluation's scope under the knobs as they are now; None when the probe is off."""
    settings, warnings = read_settings()
    for warning in warnings:
        say_once(warning)
    if not settings.enabled:
        state.end_probing()
        return None
    return state.begin_evaluation(settings)


def _scoped_simple_evaluate(original: Callable) -> Callable:
    def simple_evaluate(*args: Any, **kwargs: Any) -> Any:
        try:
            probe = _begin()
        except Exception as error:
            say(f"could not start this evaluation's scope ({error!r}); it runs unprobed")
            state.end_probing()  # never let it fall into the previous evaluation's scope
            probe = None
        results = original(*args, **kwargs)
        if probe is not None and isinstance(results, dict):
            try:
                results[EVIDENCE_KEY] = probe.evidence_document()
            except Exception as error:
                probe.errors.report("simple_evaluate", error)
        return results

    return mark(simple_evaluate, original)


def install_evaluations(evaluator: Any) -> None:
    """Give every later ``simple_evaluate`` call its own scope (idempotent)."""
    if not callable(evaluator.__dict__.get("simple_evaluate")):
        raise LookupError("lm_eval.evaluator has no simple_evaluate")
    wrap(evaluator, "simple_evaluate", _scoped_simple_evaluate)


def uninstall_evaluations(evaluator: Any) -> None:
    restore_where(lambda owner, name: owner is evaluator and name == "simple_evaluate")


def is_installed(evaluator: Any) -> bool:
    return is_ours(evaluator.__dict__.get("simple_evaluate"))


INTEGRATION = Integration(
    waits_for="lm_eval.evaluator",
    install=install_evaluations,
    uninstall=uninstall_evaluations,
    is_installed=is_installed,
    tested=LM_EVAL,
    unprobed="every evaluation of this process shares one scope",
)
