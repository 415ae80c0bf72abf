"""Glue for lm-eval's evaluator: each ``simple_evaluate`` call is an evaluation with a scope
of its own (``state.begin_evaluation``), so that a sweep's second evaluation never inherits
the first one's groups, trips, run identity, sidecar or gates.

Where an evaluation starts, in every release the suite covers: ``simple_evaluate`` in
``lm_eval/evaluator.py``. Its callers look it up there when they call it: 0.4.9.2's
``__main__`` calls ``evaluator.simple_evaluate``; 0.4.12, 0.4.13 and b315ef3 (``_cli/run.py``)
run ``from lm_eval import simple_evaluate`` inside the command, which lm-eval's module
``__getattr__`` answers by importing it from ``lm_eval.evaluator`` at that moment; so does a
script's ``lm_eval.simple_evaluate(...)``. A script may also call ``evaluate`` itself (with an
``lm`` it built): that call is an evaluation too, and the one ``simple_evaluate`` makes
belongs to its caller's. Replacing the modules' attributes right after it is imported
reaches them all. The scope in use is kept per thread and task (``state.active``), so that
evaluations run by two threads at once never share one, and what runs after an
evaluation, outside any, never falls into the ended one's scope. Only a
``from lm_eval.evaluator import simple_evaluate`` made before the probe installed keeps the
original (that evaluation then shares the default scope).

The evaluation's evidence goes into the results it returns, under the probe's key, so the
results file saved from them carries that evaluation's evidence and no other's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from probe.runtime.core.contract import EVIDENCE_KEY, Settings, read_settings
from probe.runtime.evaluator.samples import mark_blanks
from probe.runtime.hooking.integration import Integration
from probe.runtime.hooking.patching import mark, restore_where, wrap
from probe.runtime.hooking.versions import LM_EVAL
from probe.runtime.scope import state
from probe.runtime.scope.log import say, say_once
from probe.runtime.scope.report import settle


def _begin() -> tuple[state.Probe | None, Settings | None]:
    """Start this evaluation's scope under the knobs as they are now (and those knobs); no
    scope when the probe is off, or when the scope cannot be started."""
    try:
        settings, warnings = read_settings()
        for warning in warnings:
            say_once(warning)
        if not settings.enabled:
            state.end_probing()
            return None, settings
        return state.begin_evaluation(settings), settings
    except Exception as error:
        say(f"could not start this evaluation's scope ({error!r}); it runs unprobed")
        state.end_probing()  # never let it fall into the previous evaluation's scope
        return None, None


def _scoped(original: Callable) -> Callable:
    """``original`` (``simple_evaluate``, or ``evaluate`` when called directly) run as an
    evaluation of its own; a call made inside an evaluation (``simple_evaluate`` calls
    ``evaluate``) belongs to that one."""

    def evaluation(*args: Any, **kwargs: Any) -> Any:
        if state.in_evaluation():
            return original(*args, **kwargs)
        probe, settings = _begin()
        token = state.enter(probe)
        try:
            results = original(*args, **kwargs)
        finally:
            ended = _leave(token, probe, settings, original)
        if ended is not None and isinstance(results, dict) and EVIDENCE_KEY not in results:
            results[EVIDENCE_KEY] = ended.evidence_document()
        if probe is not None:
            try:
                mark_blanks(results)
            except Exception as error:
                probe.errors.report("marking the logged samples", error)
        return results

    functools.update_wrapper(evaluation, original)
    return mark(evaluation, original)


def _leave(token: Any, probe: state.Probe | None, settings: Settings | None, original: Callable) -> Any:
    """End the evaluation (``state.leave``) and settle it (``report.settle``); what is kept of
    it, or None (an error is reported)."""
    try:
        ended = state.leave(token, probe, settings)
    except Exception as error:
        if probe is not None:
            probe.errors.report(getattr(original, "__name__", "evaluate"), error)
        return None
    if ended is not None:
        settle([ended])
        ended.reported = True
    return ended


# Where an evaluation starts: simple_evaluate, or evaluate when a script calls it directly.
_ENTRIES = ("simple_evaluate", "evaluate")


def install_evaluations(evaluator: Any) -> None:
    """Give every later evaluation its own scope (idempotent)."""
    if not callable(evaluator.__dict__.get("simple_evaluate")):
        raise LookupError("lm_eval.evaluator has no simple_evaluate")
    for name in _ENTRIES:
        wrap(evaluator, name, _scoped)


def uninstall_evaluations(evaluator: Any) -> None:
    restore_where(lambda owner, name: owner is evaluator and name in _ENTRIES)


INTEGRATION = Integration(
    waits_for="lm_eval.evaluator",
    install=install_evaluations,
    uninstall=uninstall_evaluations,
    tested=LM_EVAL,
    unprobed="every evaluation of this process shares one scope",
)
