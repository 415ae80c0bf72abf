"""Turning a result directory into a verdict: ok, below_floor or unavailable.

A measured 0.0 is a measurement (below the floor); an error is not (unavailable); a
run the probe short-circuited is never ok, and carries the probe's evidence.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from probe.reader.results import read_score
from probe.reader.scores import accuracy_meets_floor, finite_score
from probe.reader.sidecar import read_sidecar
from probe.runtime.contract import PATHOLOGY

# A sidecar whose trip predates the start of the run in the results file by more than
# this is from an earlier run in the same directory.
_STALE_SLACK_S = 5.0


def classify(
    result_dir: Path | str,
    floor: float,
    task: str | None = None,
    metric: str | None = None,
    higher_is_better: bool = True,
    now: float | None = None,
) -> dict[str, Any]:
    """The verdict on ``result_dir``, as plain JSON-serialisable data.

    Rules, in order: an unreadable sidecar makes the run unavailable (nobody can tell
    whether the probe cut it short); a tripped probe means below_floor with the
    pathology attached, whatever the score; no results file or no finite score means
    unavailable; a finite score under the floor means below_floor; else ok.

    ``floor`` must be finite (ValueError otherwise: against NaN every score would read as
    below the floor). ``now`` (default: the clock) is when recorded times must lie before.
    """
    if finite_score(floor) is None:
        raise ValueError(f"the floor must be a finite number, not {floor!r}")
    result_dir = Path(result_dir)
    now = time.time() if now is None else now
    score = read_score(result_dir, task, metric, now)
    value = finite_score(score.raw) if score.reason is None else None
    sidecar = read_sidecar(result_dir, now)
    verdict: dict[str, Any] = {
        "status": None,
        "reason": None,
        "score": value,
        "floor": floor,
        "higher_is_better": higher_is_better,
        "task": score.task,
        "metric": score.metric,
        "results_file": str(score.path) if score.path else None,
        "sidecar": {"state": sidecar.state, "path": str(sidecar.path), "error": sidecar.error},
        "pathology": None,
    }
    tripped = sidecar.state == "valid" and sidecar.trip.get("tripped") is True
    if tripped and score.started_at is not None and sidecar.trip["tripped_at"] < score.started_at - _STALE_SLACK_S:
        verdict["sidecar"]["state"] = "stale"
        verdict["sidecar"]["error"] = "the sidecar predates the run in the newest results file; ignored"
        tripped = False

    if sidecar.state == "unreadable":
        return _decide(verdict, "unavailable", f"the probe's sidecar is unreadable ({sidecar.error}): "
                       "whether the run was short-circuited cannot be told")  # fmt: skip
    if tripped:
        verdict["pathology"] = _pathology(sidecar.trip, sidecar.final)
        missing = "" if value is not None else f"; and no finite score ({score.reason or _bad_value(score.raw)})"
        return _decide(verdict, "below_floor", f"generation pathology: {PATHOLOGY} (the probe tripped){missing}")
    if score.reason is not None:
        return _decide(verdict, "unavailable", score.reason)
    if value is None:
        return _decide(verdict, "unavailable", _bad_value(score.raw))
    if accuracy_meets_floor(value, floor, higher_is_better):
        return _decide(verdict, "ok", "the score meets the floor")
    return _decide(verdict, "below_floor", "the score is below the floor")


def _decide(verdict: dict[str, Any], status: str, reason: str) -> dict[str, Any]:
    verdict["status"] = status
    verdict["reason"] = reason
    return verdict


def _bad_value(raw: Any) -> str:
    return f"the score {raw!r} is not a finite number"


def _pathology(evidence: dict[str, Any], final: dict[str, Any] | None) -> dict[str, Any]:
    keys = (
        "pathology", "observations", "pathological", "ratio", "finish_reasons", "repetition", "max_tokens",
        "group", "settings", "settings_fingerprint", "tripped_at_iso", "seconds_since_first_request", "pid",
        "lm_eval_version", "model", "base_url",
    )  # fmt: skip
    found = {k: evidence.get(k) for k in keys}
    found["short_circuited_requests"] = final.get("short_circuited_requests") if final else None
    found["cancelled_in_flight"] = final.get("cancelled_in_flight") if final else None
    return found


def describe(verdict: dict[str, Any]) -> str:
    """A human summary of a verdict: status, score, floor, file, and the evidence."""
    what = f"{verdict['metric']} of {verdict['task']}" if verdict["task"] else "no task"
    score = "none" if verdict["score"] is None else f"{verdict['score']:g}"
    side = "higher" if verdict["higher_is_better"] else "lower"
    lines = [
        f"status:  {verdict['status']} ({verdict['reason']})",
        f"score:   {score} ({what}); floor {verdict['floor']:g}, {side} is better",
        f"results: {verdict['results_file'] or 'none found'}",
        f"sidecar: {verdict['sidecar']['state']}"
        + (f" ({verdict['sidecar']['error']})" if verdict["sidecar"]["error"] else ""),
    ]
    found = verdict["pathology"]
    if found:
        reasons = ", ".join(f"{k}={v}" for k, v in (found["finish_reasons"] or {}).items())
        caps = ", ".join(str(m) for m in found["max_tokens"] or [])
        if found["short_circuited_requests"] is None:
            after = "The final counters were not written (the process ended before its exit handlers ran)."
        else:
            after = (
                f"{found['short_circuited_requests']} requests were then answered with empty strings without "
                f"contacting the server, and {found['cancelled_in_flight']} in-flight requests were cancelled."
            )
        lines.append(
            f"evidence: the probe tripped on a generation pathology ({found['pathology']}, the model does not stop). "
            f"{found['pathological']} of {found['observations']} generations it observed ended at the max_tokens "
            f"cap ({caps}) or by repetition (finish reasons: {reasons}), "
            f"{found['seconds_since_first_request']} s after the first request. {after} "
            f"Model {found['model']} at {found['base_url']}, lm-eval {found['lm_eval_version']}, "
            f"probe settings {found['settings_fingerprint']}."
        )
    return "\n".join(lines)
