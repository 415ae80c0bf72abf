"""Which metric of a task's results row is its score, when no ``--metric`` is given."""

from __future__ import annotations

from typing import Any

# Metrics that read as accuracy, in order of preference, for the documented default.
ACCURACY_LIKE = ("exact_match", "acc", "acc_norm", "f1", "pass@1", "accuracy")


def pick_metric(metrics: dict[str, Any]) -> str | None:
    """A task's first accuracy-like metric (see ACCURACY_LIKE), else its first numeric one."""
    names = [k for k in metrics if "_stderr" not in k and k != "alias"]
    for wanted in ACCURACY_LIKE:
        for name in names:
            if name.split(",")[0] == wanted:
                return name
    return next((n for n in names if isinstance(metrics[n], (int, float)) and not isinstance(metrics[n], bool)), None)
