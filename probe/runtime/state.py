"""The probe's process-wide state, and the one decision it takes: trip a group or not.

``Probe`` only coordinates: evidence lives in ``groups``, the sidecar in ``ownership``,
error reports in ``log``, the gates in ``gate``; the backends (``api``) turn calls into
requests and requests into answers.
"""

from __future__ import annotations

import os
import time
from typing import Any

from probe.runtime.answers import blanks
from probe.runtime.contract import PROBE_VERSION, Settings, settings_fingerprint, sidecar_path
from probe.runtime.evidence import classify_response
from probe.runtime.gate import Gates
from probe.runtime.groups import Group, Groups, Request
from probe.runtime.log import ErrorReports, say
from probe.runtime.ownership import SidecarOwnership
from probe.runtime.sidecar import trip_document
from probe.runtime.versions import lm_eval_version


class Probe:
    """Evidence per group, the trip, and the final counters, for one process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.started_at = time.time()
        self.groups = Groups()
        self.ownership = SidecarOwnership(self.started_at)
        self.errors = ErrorReports()
        self.gates = Gates(settings)

    def request(self, lm: Any, gen_kwargs: Any, n_answers: int, max_tokens: int | None) -> Request:
        """Register one generate request of ``n_answers`` prompts."""
        group = self.groups.get(gen_kwargs)
        is_evidence = max_tokens is not None and max_tokens >= self.settings.min_max_tokens
        return Request(group, lm, n_answers, max_tokens or 0, is_evidence)

    def blanks(self, request: Request) -> list[str]:
        """The made-up answers of a short-circuited request (and count it)."""
        with self.groups.lock:
            request.group.short_circuited += 1
        return blanks(request.n_answers)

    def observe(self, request: Request, response: Any) -> None:
        """Record the evidence of one response, and trip when the rule fires; never raises."""
        try:
            self._record(request, response)
        except Exception as error:
            self.errors.report("observe", error)

    def _record(self, request: Request, response: Any) -> None:
        if request.observed or not request.is_evidence:
            return
        request.observed = True
        labels = request.labels = classify_response(response, request.max_tokens)
        group = request.group
        with self.groups.lock:
            group.tally.add(labels, request.max_tokens)
            if not group.tripped and not group.trip_failed and group.tally.fires(self.settings):
                self._trip(group, request.lm)

    def _trip(self, group: Group, lm: Any) -> None:
        path = os.path.abspath(sidecar_path())
        document = trip_document(
            group.tally.as_dict(), group.gen_kwargs, self.settings, self.groups.first_request_at,
            lm_eval_version(), getattr(lm, "model", None), getattr(lm, "base_url", None),
        )  # fmt: skip
        try:
            where = self.ownership.claim(path, document)
        except Exception as error:
            group.trip_failed = True
            say(
                f"TRIP NOT APPLIED: the evidence says the model does not stop ({_evidence(group)}), "
                f"but the sidecar {path} could not be written ({error!r}). Evaluation continues unprobed "
                "so that no unexplained zero is produced. Set RESULT_DIR to a writable directory."
            )
            return
        group.tripped = True
        say(
            f"tripped: {_evidence(group)} in the group {group.key}; {where}; answering this group's "
            "remaining generate requests with empty strings and cancelling those in flight"
        )
        group.inflight.cancel_all()

    def finalise(self) -> None:
        """Add the final counters to the sidecar this process wrote (once, at exit)."""
        with self.groups.lock:
            groups = [g.summary() for g in self.groups if g.tripped]
            self.ownership.finalise(
                {
                    "short_circuited_requests": sum(g["short_circuited_requests"] for g in groups),
                    "cancelled_in_flight": sum(g["cancelled_in_flight"] for g in groups),
                    "short_circuited_groups": groups,
                    "written_at": time.time(),
                }
            )

    def report_document(self) -> dict[str, Any]:
        """Everything this process observed, per group, whether or not it tripped."""
        with self.groups.lock:
            return {
                "probe_version": PROBE_VERSION,
                "pid": os.getpid(),
                "settings": self.settings.as_dict(),
                "settings_fingerprint": settings_fingerprint(self.settings),
                "groups": [group.summary() for group in self.groups],
            }


def _evidence(group: Group) -> str:
    tally = group.tally
    caps = ",".join(str(m) for m in sorted(tally.max_tokens))
    return (
        f"{tally.pathological}/{tally.observed} generations ended without stopping "
        f"(finish reasons {dict(tally.reasons)}) at max_tokens={caps}"
    )


# The one probe of this process, once installed; the wrappers look it up on every call.
ACTIVE: Probe | None = None
