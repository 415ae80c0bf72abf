"""The probe's process-wide state, and the one decision it takes: trip a group or not.

``Probe`` only coordinates: evidence lives in ``groups``, the sidecar in ``ownership``,
error reports in ``log``, the gates in ``gate``; the backends (``api``) turn calls into
requests and requests into answers.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from probe.runtime.answers import blanks
from probe.runtime.contract import (
    PROBE_VERSION,
    SCHEMA_VERSION,
    Settings,
    run_id,
    settings_fingerprint,
    sidecar_path,
)
from probe.runtime.evidence import describe_choices
from probe.runtime.gate import Gates
from probe.runtime.groups import Group, Groups, Request, group_key
from probe.runtime.log import ErrorReports, say
from probe.runtime.ownership import SidecarOwnership
from probe.runtime.sidecar import trip_document
from probe.runtime.tasks import TaskBook
from probe.runtime.versions import lm_eval_version


class Probe:
    """Evidence per group, the trip, and the final counters, for one process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._run_id: str | None = None
        self.groups = Groups()
        self.tasks = TaskBook()
        self.loglikelihood_requests = 0
        self.backends: set[str] = set()  # lm-eval's backends seen making generate requests
        self.ownership = SidecarOwnership()
        self.errors = ErrorReports()
        self.gates = Gates(settings)

    @property
    def run_id(self) -> str:
        """This run's identity, settled on first use: lm-eval hands the model its requests (the
        first use) from inside ``simple_evaluate``, which starts a run of its own."""
        if self._run_id is None:
            self._run_id = run_id(fresh=_evaluating_here())
        return self._run_id

    def register(self, requests: Any) -> None:
        """Note the task of every generate request lm-eval hands the model (its Instances)."""
        self.run_id  # noqa: B018 - settle the identity before the requests start workers
        entries = []
        for instance in requests:
            args = getattr(instance, "args", ())
            gen_kwargs = args[1] if len(args) > 1 else {}
            entries.append((args[0] if args else None, group_key(gen_kwargs)[0], getattr(instance, "task_name", None)))
        with self.groups.lock:
            self.tasks.register(entries)

    def request(
        self,
        lm: Any,
        gen_kwargs: Any,
        prompts: list[Any],
        max_tokens: int | None,
        backend: str = "api",
        tasks: list[str | None] | None = None,
    ) -> Request:
        """One generate request for ``prompts`` (as lm-eval passes them), in its group, made by
        ``backend``; each prompt's task is looked up unless the backend knows ``tasks``."""
        group = self.groups.get(gen_kwargs)
        with self.groups.lock:
            self.backends.add(backend)
            if tasks is None:
                tasks = [self.tasks.task_of(prompt, group.key) for prompt in prompts]
        is_evidence = max_tokens is not None and max_tokens >= self.settings.min_max_tokens
        return Request(group, lm, tasks, max_tokens or 0, is_evidence, backend=backend)

    def count_loglikelihood(self, n: int) -> None:
        with self.groups.lock:
            self.loglikelihood_requests += n

    def blanks(self, request: Request, cancelled: bool = False) -> list[str]:
        """The made-up answers of a short-circuited request (``cancelled`` in flight, or
        never sent), counted in its group and its tasks."""
        with self.groups.lock:
            request.group.short_circuited += 1
            request.group.cancelled += cancelled
            for task in request.tasks:
                evidence = self.tasks.of(task)
                evidence.short_circuited += 1
                evidence.cancelled += cancelled
        return blanks(request.n_answers)

    def observe(self, request: Request, response: Any) -> None:
        """Record the evidence of one response, and trip when the rule fires; never raises."""
        try:
            self._record(request, response)
        except Exception as error:
            self.errors.report("observe", error)

    def _record(self, request: Request, response: Any) -> None:
        if request.observed:
            return
        request.observed = True
        choices = describe_choices(response, request.max_tokens)
        group = request.group
        with self.groups.lock:
            for choice in choices:
                task = request.task_of_choice(choice.index)
                self.tasks.of(task).add(choice, request.max_tokens, request.is_evidence)
            if not request.is_evidence:
                return
            # The gate's slow start learns from what the request's answers said.
            request.labels = [choice.label for choice in choices]
            group.tally.add(request.labels, request.max_tokens)
            if not group.tripped and not group.trip_failed and group.tally.fires(self.settings):
                self._trip(group, request.lm, request.backend)

    def _trip(self, group: Group, lm: Any, backend: str = "api") -> None:
        path = os.path.abspath(sidecar_path())
        document = trip_document(
            self.run_id, group.tally.as_dict(), group.gen_kwargs, self._tasks_of(group), self.settings,
            self.groups.first_request_at,
            lm_eval_version(), getattr(lm, "model", None), getattr(lm, "base_url", None), backend=backend,
        )  # fmt: skip
        try:
            where = self.ownership.claim(path, document)
        except Exception as error:
            group.trip_failed = True
            say(
                f"TRIP NOT APPLIED: the evidence says the model does not stop ({_evidence(group)}), "
                f"but the sidecar {path} could not be written ({error}). Evaluation continues unprobed "
                "so that no unexplained zero is produced. Set RESULT_DIR to a writable directory that holds "
                "no such file."
            )
            return
        group.tripped = True
        say(
            f"tripped: {_evidence(group)} in the group {group.key}; {where}; answering this group's "
            "remaining generate requests with empty strings and cancelling those in flight"
        )
        group.inflight.cancel_all()

    def _tasks_of(self, group: Group) -> list[str]:
        return sorted(self.tasks.tasks_of_group.get(group.key, set()))

    def _summary(self, group: Group) -> dict[str, Any]:
        return group.summary(set(self._tasks_of(group)))

    def finalise(self) -> None:
        """Add the final counters to the sidecar this process wrote (once, at exit)."""
        with self.groups.lock:
            groups = [self._summary(g) for g in self.groups if g.tripped]
            self.ownership.finalise(
                {
                    "short_circuited_requests": sum(g["short_circuited_requests"] for g in groups),
                    "cancelled_in_flight": sum(g["cancelled_in_flight"] for g in groups),
                    "short_circuited_groups": groups,
                    "written_at": time.time(),
                }
            )

    def evidence_document(self) -> dict[str, Any]:
        """Everything this process observed, per task and per group, tripped or not.

        It travels inside lm-eval's results file (see ``results``) and in the report that
        ``eval-probe run`` reads. Plain JSON; no key has the ``metric,filter`` shape that
        lm-eval's and InferenceX's readers take for a score.
        """
        with self.groups.lock:
            tripped_groups = {g.key for g in self.groups if g.tripped}
            tasks = {
                name: evidence.as_dict(tripped=bool(evidence.groups & tripped_groups))
                for name, evidence in self.tasks.evidence.items()
                if name is not None
            }
            unknown = self.tasks.evidence.get(None)
            return {
                "schema_version": SCHEMA_VERSION,
                "probe_version": PROBE_VERSION,
                "backends": sorted(self.backends),
                "run_id": self.run_id,
                "pid": os.getpid(),
                "settings": self.settings.as_dict(),
                "settings_fingerprint": settings_fingerprint(self.settings),
                "sampling": self.gates.sampling.as_dict(),
                "tripped": bool(tripped_groups),
                "sidecar": self.ownership.path,
                "tasks": dict(sorted(tasks.items())),
                "unattributed": unknown.as_dict(bool(unknown.groups & tripped_groups)) if unknown else None,
                "groups": [self._summary(group) for group in self.groups],
                "loglikelihood_requests": self.loglikelihood_requests,
            }


def _evaluating_here() -> bool:
    """Whether lm-eval's ``simple_evaluate`` is running on this thread's stack: then this
    process runs an evaluation, and is the origin of a run."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "simple_evaluate" and frame.f_globals.get("__name__") == "lm_eval.evaluator":
            return True
        frame = frame.f_back
    return False


def _evidence(group: Group) -> str:
    tally = group.tally
    caps = ",".join(str(m) for m in sorted(tally.max_tokens))
    return (
        f"{tally.pathological}/{tally.observed} generations ended without stopping "
        f"(finish reasons {dict(tally.reasons)}) at max_tokens={caps}"
    )


# The one probe of this process, once installed; the wrappers look it up on every call.
ACTIVE: Probe | None = None
