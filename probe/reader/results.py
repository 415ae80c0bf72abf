"""Which metric of a task's results row is its score, when no ``--metric`` is given.

It is one that lm-eval measured, never a count (``sample_len``) or a placeholder (``bypass``). See
docs/reading.md.
"""

from __future__ import annotations

from typing import Any

# Metrics that read as accuracy, in order of preference, for the documented default.
ACCURACY_LIKE = ("exact_match", "acc", "acc_norm", "f1", "pass@1", "accuracy")
# lm-eval's placeholder metric where nothing was measured (--predict_only).
PLACEHOLDERS = ("bypass",)


def measured(metrics: dict[str, Any], directions: dict[str, bool] | None) -> list[str]:
    """The keys of a results row that hold what lm-eval measured.

    Those are ``metric,filter`` keys, never a standard error or a placeholder. Where the file
    records the task's ``higher_is_better``, only the metrics named there count.
    """
    names = []
    for key in metrics:
        base, comma, _ = key.partition(",")
        known = directions is None or base in directions
        if comma and known and not base.endswith("_stderr") and base not in PLACEHOLDERS:
            names.append(key)
    return names


def pick_metric(metrics: dict[str, Any], directions: dict[str, bool] | None = None) -> tuple[str | None, str]:
    """(the task's score metric, "") or (None, why none can be chosen).

    It is the first accuracy-like metric (see ACCURACY_LIKE), else the only one measured.
    """
    names = measured(metrics, directions)
    for wanted in ACCURACY_LIKE:
        for name in names:
            if name.split(",")[0] == wanted:
                return name, ""
    if len(names) == 1:
        return names[0], ""
    if not names:
        return None, "lm-eval measured no metric for this task (a --predict_only run measures none)"
    listed = ", ".join(names)
    return None, f"lm-eval measured {len(names)} metrics ({listed}), none accuracy-like: choose one with --metric"
