"""A score in the newest results file of a result directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.reader.candidates import list_candidates, newest

# Metrics that read as accuracy, in order of preference, for the documented default.
ACCURACY_LIKE = ("exact_match", "acc", "acc_norm", "f1", "pass@1", "accuracy")


@dataclass(frozen=True)
class Score:
    """The raw value found, where it was found, and why nothing was when it was not."""

    path: Path | None
    task: str | None
    metric: str | None
    raw: Any = None
    reason: str | None = None
    started_at: float | None = None


def read_score(result_dir: Path, task: str | None = None, metric: str | None = None, now: float | None = None) -> Score:
    """The score of ``task``/``metric`` in the newest results file (see ``candidates.newest``).

    With no task, the first task in the file; with no metric, the task's first metric
    whose name (before the comma) is accuracy-like (see ACCURACY_LIKE), else its first
    numeric one. The choice made is reported in the returned Score. When the newest file
    cannot be told or read, the Score has no value and its ``reason`` says why.
    """
    chosen = newest(list_candidates(result_dir, now))
    if chosen is None:
        return Score(None, task, metric, reason=f"no results file under {result_dir} (lm-eval's "
                     "results_<time>.json, or InferenceX's results_<time>_conc<N>.json)")  # fmt: skip
    if chosen.reason is not None or chosen.results is None:
        return Score(chosen.path, task, metric, reason=chosen.reason)
    path, results, started = chosen.path, chosen.results, chosen.started_at
    if task is None:
        task = next(iter(results), None)
    if task not in results or not isinstance(results[task], dict):
        return Score(path, task, metric, reason=f"task {task!r} is not in {path.name}", started_at=started)
    metrics = results[task]
    metric = metric or pick_metric(metrics)
    if metric is None or metric not in metrics:
        return Score(path, task, metric, reason=f"metric {metric!r} is not in task {task!r}", started_at=started)
    return Score(path, task, metric, raw=metrics[metric], started_at=started)


def pick_metric(metrics: dict[str, Any]) -> str | None:
    """A task's first accuracy-like metric (see ACCURACY_LIKE), else its first numeric one."""
    names = [k for k in metrics if "_stderr" not in k and k != "alias"]
    for wanted in ACCURACY_LIKE:
        for name in names:
            if name.split(",")[0] == wanted:
                return name
    return next((n for n in names if isinstance(metrics[n], (int, float)) and not isinstance(metrics[n], bool)), None)
