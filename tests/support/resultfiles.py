"""Result directories as lm-eval, InferenceX and the probe leave them, for the reader's tests."""

from __future__ import annotations

import json
from pathlib import Path

from probe.runtime.core import contract
from probe.runtime.core.contract import EVIDENCE_KEY

METRIC = "exact_match,strict-match"
# lm-eval's `date`: time.time() when the evaluation started (a past instant by default).
STARTED = 1_764_460_800.0
NAME = "results_2026-11-30T01-00-00.000000.json"


def written_by_lm_eval(output: Path, pattern: str) -> list[Path]:
    """The files matching ``pattern`` that lm-eval wrote for ``--output_path output``: in its model
    directory (the releases), or in ``output`` itself (InferenceX's lm-eval (b315ef3), whose
    parsed ``--model_args`` are a dict in which its model-name lookup finds no name)."""
    return sorted([*output.glob(pattern), *output.glob(f"*/{pattern}")])


def write_results(directory: Path, value: object, name: str = NAME, subdir: str | None = "model", **extra) -> Path:
    """A results file whose task gsm8k scores ``value``, under ``directory/subdir`` (lm-eval's model
    directory; None for InferenceX's staged, flat layout). ``date`` defaults to STARTED."""
    path = directory / subdir / name if subdir else directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"results": {"gsm8k": {"alias": "gsm8k", METRIC: value, "x_stderr": 0.1}}, "date": STARTED, **extra}
    path.write_text(json.dumps(document))
    return path


def write_sidecar(
    directory: Path, tripped_at: float = 1.0, name: str = contract.SIDECAR_NAME, record: dict | None = None, **changes
) -> Path:
    """A valid sidecar of a tripped probe (at ``name``: a record moved aside is
    ``<sidecar>.stale-<time>``), its trip record updated with ``record``, the document's keys
    replaced by ``changes``."""
    document = {
        "schema_version": 1,
        "verdict": {
            "tripped": True, "pathology": "non_terminating", "observations": 16, "pathological": 16,
            "finish_reasons": {"length": 16}, "max_tokens": [16384], "settings": {}, "tripped_at": tripped_at,
            "seconds_since_first_request": 70.1, "model": "m", "base_url": "http://h/v1",
        },
        "final": {"short_circuited_requests": 1303, "cancelled_in_flight": 48},
    }  # fmt: skip
    document["verdict"].update(record or {})
    document.update(changes)
    path = directory / name
    path.write_text(json.dumps(document))
    return path


def figures(**changes: object) -> dict:
    """One task's evidence as the probe writes it: 40 healthy generations, with ``changes``;
    unless they say otherwise, each request observed or blanked once, each ending a stop."""
    observed = changes.get("observations", 40)
    found = {
        "generate_requests": observed + changes.get("short_circuited", 0), "observations": observed,
        "finish_reasons": {"stop": observed}, "cut_off": 0,
        "cut_off_rate": 0.0, "causes": {"output_cap": 0}, "empty_answers": 0, "short_circuited": 0,
        "cancelled_in_flight": 0, "below_min_max_tokens": 0, "unknown_budget": 0, "max_tokens": [2048],
        "tripped": False,
    }  # fmt: skip
    found.update(changes)
    return found


def evidence(tasks: dict, tripped: bool = False, run_id: str = "f" * 32 + ".1") -> dict:
    """The probe's entry in a results file, for ``tasks`` (name -> figures)."""
    return {"schema_version": 1, "run_id": run_id, "tripped": tripped, "tasks": tasks, "unattributed": None}


def write_run(
    directory: Path,
    scores: dict[str, float],
    tasks: dict,
    tripped: bool = False,
    run_id: str = "f" * 32 + ".1",
    **extra: object,
) -> Path:
    """A probed run's results file: ``scores`` (task -> score) and the evidence of ``tasks``;
    ``extra`` as for :func:`write_results` (``subdir``, ``name``, ``date``, document keys)."""
    path = write_results(directory, 0.0, **{EVIDENCE_KEY: evidence(tasks, tripped, run_id)}, **extra)
    document = json.loads(path.read_text())
    document["results"] = {name: {"alias": name, METRIC: score} for name, score in scores.items()}
    path.write_text(json.dumps(document))
    return path
