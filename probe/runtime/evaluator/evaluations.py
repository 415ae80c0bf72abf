"""Glue for lm-eval's evaluator: each ``simple_evaluate`` call is an evaluation with a scope of its own.

So a sweep's second evaluation never inherits the first one's groups, trips, run identity, sidecar or gates.
A direct call to ``evaluate`` is an evaluation too; the one ``simple_evaluate`` makes belongs to its caller's.
The scope in use is kept per thread and task (``state.active``).
The results an evaluation returns carry its own evidence, under the probe's key, and no other's.
See docs/how-it-works.md.
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
    tested=(LM_EVAL,),
    unprobed="every evaluation of this process shares one scope",
)
