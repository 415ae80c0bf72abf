"""Carrying the evidence inside lm-eval's own results file.

Pipelines move or upload only ``results*.json`` (InferenceX's CI does), so the evidence
travels there: one namespaced top-level entry added to the document lm-eval saves. It
holds no ``lm_eval_version`` key and no ``metric,filter`` key, and nothing of lm-eval's is
removed or renamed, so lm-eval's and InferenceX's readers see the file as before.

Results returned by ``simple_evaluate`` already carry their own evaluation's evidence
(``evaluations``); only results made otherwise get the active scope's here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from probe.runtime.core.contract import EVIDENCE_KEY
from probe.runtime.hooking.patching import mark, wrap
from probe.runtime.scope import state


def _carrying_evidence(original: Callable) -> Callable:
    def save_results_aggregated(self: Any, results: Any, *args: Any, **kwargs: Any) -> Any:
        probe = state.active()
        if probe is not None and isinstance(results, dict) and EVIDENCE_KEY not in results:
            try:
                results[EVIDENCE_KEY] = probe.evidence_document()
            except Exception as error:
                probe.errors.report("save_results_aggregated", error)
        return original(self, results, *args, **kwargs)

    return mark(save_results_aggregated, original)


def carry_evidence(evaluation_tracker: Any) -> None:
    """Patch lm-eval's ``EvaluationTracker`` so that saved results carry the evidence."""
    wrap(evaluation_tracker.EvaluationTracker, "save_results_aggregated", _carrying_evidence)
