"""Finding lm-eval's results file in a result directory, and a score in it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def newest_results(result_dir: Path) -> Path | None:
    """The newest ``results_<ISO time>.json`` anywhere under ``result_dir``.

    lm-eval nests it in a directory named after the model; the ISO time in the name
    orders the files (the modification time breaks ties).
    """
    found = [p for p in Path(result_dir).rglob("results_*.json") if p.is_file()]
    if not found:
        return None
    return max(found, key=lambda p: (p.name, p.stat().st_mtime))


def read_score(result_dir: Path, task: str | None = None, metric: str | None = None) -> Score:
    """The score of ``task``/``metric`` in the newest results file.

    With no task, the first task in the file; with no metric, the task's first metric
    whose name (before the comma) is accuracy-like (see ACCURACY_LIKE), else its first
    numeric one. The choice made is reported in the returned Score.
    """
    path = newest_results(result_dir)
    if path is None:
        return Score(None, task, metric, reason=f"no results_*.json under {result_dir}")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        results = document["results"]
        if not isinstance(results, dict):
            raise TypeError("'results' is not an object")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        return Score(path, task, metric, reason=f"cannot read {path}: {error!r}")
    started = document.get("date") if isinstance(document.get("date"), (int, float)) else None
    if task is None:
        task = next(iter(results), None)
    if task not in results or not isinstance(results[task], dict):
        return Score(path, task, metric, reason=f"task {task!r} is not in {path.name}", started_at=started)
    metrics = results[task]
    metric = metric or _default_metric(metrics)
    if metric is None or metric not in metrics:
        return Score(path, task, metric, reason=f"metric {metric!r} is not in task {task!r}", started_at=started)
    return Score(path, task, metric, raw=metrics[metric], started_at=started)


def _default_metric(metrics: dict[str, Any]) -> str | None:
    names = [k for k in metrics if "_stderr" not in k and k != "alias"]
    for wanted in ACCURACY_LIKE:
        for name in names:
            if name.split(",")[0] == wanted:
                return name
    return next((n for n in names if isinstance(metrics[n], (int, float)) and not isinstance(metrics[n], bool)), None)
