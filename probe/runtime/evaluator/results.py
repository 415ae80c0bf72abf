"""Carrying the evidence inside lm-eval's own results file.

The evidence is one namespaced top-level entry added to the document lm-eval saves.
Nothing of lm-eval's is removed or renamed, so its readers see the file unchanged.
Results made outside ``simple_evaluate`` get the active scope's evidence here.
See docs/evidence.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from probe.runtime.core.contract import EVIDENCE_KEY
from probe.runtime.hooking.integration import Integration
from probe.runtime.hooking.patching import mark, restore_where, wrap
from probe.runtime.hooking.versions import LM_EVAL
from probe.runtime.scope import state
from probe.runtime.scope.report import note_saved


def _carrying_evidence(original: Callable) -> Callable:
    def save_results_aggregated(self: Any, results: Any, *args: Any, **kwargs: Any) -> Any:
        probe = state.active()
        if probe is not None and isinstance(results, dict) and EVIDENCE_KEY not in results:
            try:
                results[EVIDENCE_KEY] = probe.evidence_document()
            except Exception as error:
                probe.errors.report("save_results_aggregated", error)
        saved = original(self, results, *args, **kwargs)
        _note_where(self, results)
        return saved

    return mark(save_results_aggregated, original)


def _note_where(tracker: Any, results: Any) -> None:
    """Tell ``eval-probe run`` where lm-eval saved this evaluation's results (it may not be
    where the command line says: a script's own path, a config file's)."""
    output_path = getattr(tracker, "output_path", None)
    evidence = results.get(EVIDENCE_KEY) if isinstance(results, dict) else None
    run_id = evidence.get("run_id") if isinstance(evidence, dict) else None
    if not (output_path and isinstance(output_path, str | os.PathLike) and isinstance(run_id, str)):
        return
    where = os.path.abspath(os.fspath(output_path))
    if _written(tracker, where):
        note_saved(run_id, results_dir_at(where))


def results_dir_at(output_path: str) -> str:
    """The directory to read for lm-eval's ``output_path``: the path itself, or the directory of a
    path whose ``pathlib`` suffix is ``.json`` (``res.json/`` included, ``.json`` not), beside
    which lm-eval writes ``<stem>_<time>.json``."""
    return str(PurePath(output_path).parent) if PurePath(output_path).suffix == ".json" else output_path


def _written(tracker: Any, where: str) -> bool:
    """Whether lm-eval wrote this save's results file under ``where``: it logs a failed save and
    goes on. The file is named as lm-eval names it (``<stem>_<date_id>.json`` beside a ``.json``
    path, else ``results_<date_id>.json`` in the model's directory); a release that records no
    ``date_id`` is asked only for the directory."""
    path = PurePath(where)
    json_path = path.suffix == ".json"
    date_id = getattr(tracker, "date_id", None)
    if not isinstance(date_id, str):
        return os.path.isdir(results_dir_at(where))
    if json_path:
        return os.path.isfile(path.with_name(f"{path.stem}_{date_id}.json"))
    model = getattr(getattr(tracker, "general_config_tracker", None), "model_name_sanitized", None)
    return os.path.isfile(path / str(model if model is not None else "") / f"results_{date_id}.json")


def carry_evidence(evaluation_tracker: Any) -> None:
    """Patch lm-eval's ``EvaluationTracker`` so that saved results carry the evidence."""
    wrap(evaluation_tracker.EvaluationTracker, "save_results_aggregated", _carrying_evidence)


def uncarry_evidence(evaluation_tracker: Any) -> None:
    """Restore what :func:`carry_evidence` replaced."""
    tracker = evaluation_tracker.EvaluationTracker
    restore_where(lambda owner, name: owner is tracker and name == "save_results_aggregated")


# Installed with every integration that runs in lm-eval (``registry.WITH_LM_EVAL``).
INTEGRATION = Integration(
    waits_for="lm_eval.loggers.evaluation_tracker",
    install=carry_evidence,
    uninstall=uncarry_evidence,
    tested=(LM_EVAL,),
    unprobed="lm-eval's generation (its results file would not carry the evidence)",
)
