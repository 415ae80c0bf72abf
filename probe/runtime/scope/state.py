"""The probe's state, one scope per evaluation, and the one decision it takes: trip a group or not.

Each evaluation gets a :class:`Probe` of its own, under its own lock.
So a trip in one evaluation of a sweep never touches the next.
Requests made outside any evaluation fall in the process's default scope.
``Probe`` only coordinates; evidence, sidecar, gates and logging live in sibling modules.
See docs/how-it-works.md.
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
from typing import Any

from probe.runtime.core.answers import blanks
from probe.runtime.core.contract import (
    PROBE_VERSION,
    REPETITION,
    SCHEMA_VERSION,
    Settings,
    cause_words,
    main_cause,
    run_id,
    settings_fingerprint,
    sidecar_path,
)
from probe.runtime.core.degeneration import THINKING_ENDS, LoopDetector
from probe.runtime.core.evidence import describe_choices, is_pathological, stopped_on_its_own
from probe.runtime.core.rule import sample_sizes
from probe.runtime.core.sampling import Sampling
from probe.runtime.core.sidecar import TripContext, public_url, trip_document
from probe.runtime.hooking.versions import lm_eval_version
from probe.runtime.scope.gate import Gates
from probe.runtime.scope.groups import GIVEN, PREDICTED, READ, UNREADABLE, Group, Groups, Request, group_key
from probe.runtime.scope.log import ErrorReports, say
from probe.runtime.scope.ownership import SidecarOwnership
from probe.runtime.scope.report import note_not_applied, note_trip
from probe.runtime.scope.tasks import TaskBook


class Probe:
    """Evidence per group, the trip, and the final counters, for one evaluation."""

    def __init__(self, settings: Settings, evaluation: bool = False) -> None:
        self.settings = settings
        self.lock = threading.RLock()
        # Begun by lm-eval's simple_evaluate (else the process's default scope): an evaluation
        # starts a run of its own, a default scope joins the run that started this process.
        self.evaluation = evaluation
        self._run_id: str | None = run_id(fresh=True) if evaluation else None
        self.groups = Groups(settings.min_samples, settings.length_ratio)
        self.tasks = TaskBook()
        self.loglikelihood_requests = 0
        self.backends: set[str] = set()  # lm-eval's backends seen making generate requests
        self.models: set[str] = set()  # the model names its generate requests were made for
        self.ownership = SidecarOwnership()
        self.errors = ErrorReports()
        self.gates = Gates(settings)
        self.sampling = Sampling()
        self.reported = False  # only an ended evaluation is reported before exit
        # Servers (by URL) it no longer streams to (``streamed_post``), and those whose streams broke
        # off since the last that came whole (when the first did): an evaluation's, not the process's.
        self.not_streamed: set[str] = set()
        self.broken_since: dict[str, float] = {}

    @property
    def reserve(self) -> int:
        """How many requests of each group are sent first, as the sample the rule may judge."""
        return sample_sizes(self.settings.min_samples)[2]

    @property
    def run_id(self) -> str:
        """This scope's run identity (a default scope settles it on first use)."""
        if self._run_id is None:
            self._run_id = run_id()
        return self._run_id

    def idle(self) -> bool:
        """True while nothing was asked of it: no evaluation, no request."""
        with self.lock:
            return not (self.evaluation or self.tasks.evidence or self.loglikelihood_requests or list(self.groups))

    def register(self, requests: Any) -> None:
        """Note the task of every generate request lm-eval hands the model (its Instances)."""
        self.run_id  # noqa: B018 - settle the identity before the requests start workers
        entries, groups = [], {}
        for instance in requests:
            args = getattr(instance, "args", ())
            key, settings = group_key(args[1] if len(args) > 1 else {})
            entries.append((args[0] if args else None, key, getattr(instance, "task_name", None)))
            groups.setdefault(key, [settings, 0])[1] += 1
        with self.lock:
            self.tasks.register(entries)
            for key, (settings, generations) in groups.items():
                self.groups.expect(key, settings, generations)

    def request(
        self,
        lm: Any,
        gen_kwargs: Any,
        prompts: list[Any],
        max_tokens: Any,
        backend: str = "api",
        tasks: list[str | None] | None = None,
        budget_source: str = GIVEN,
        source: Any = None,
    ) -> Request:
        """One generate request for ``prompts`` (as lm-eval passes them), in its group, made by
        ``backend`` for the model ``lm`` (only its name and address are kept); each prompt's
        task is taken from the task book when needed, unless the backend knows ``tasks``.
        ``max_tokens``: its budget, or a tuple of the budgets the server may use (it names two),
        as ``budget_source`` says (``Request.budget_source``). It takes the next place in its group's
        order (``rule``); ``source``, the object lm-eval passed the prompts in, lets a retry keep its place."""
        largest, fewest, is_evidence = self._judged(max_tokens)
        model = getattr(lm, "model", None)
        with self.lock:
            group = self.groups.get(gen_kwargs)
            self.backends.add(backend)
            if isinstance(model, str):
                self.models.add(model)
            request = Request(
                group, list(prompts), largest, is_evidence, model if isinstance(model, str) else None,
                public_url(getattr(lm, "base_url", None)), backend, tasks, fewest, budget_source=budget_source,
                source=source,
            )  # fmt: skip
            request.take_place()
        return request

    def budget_sent(self, request: Request, max_tokens: Any) -> None:
        """The budget ``request`` is sent with, read off its payload as it was built.

        It replaces the predicted budget, unless one was observed already or it cannot be read.
        See ``Request.budget_source``.
        """
        largest, fewest, is_evidence = self._judged(max_tokens)
        with self.lock:
            if not request.observed and request.budget_source != UNREADABLE:
                request.max_tokens, request.fewest, request.is_evidence = largest, fewest, is_evidence
                request.budget_source = READ

    def _unread(self, request: Request) -> None:
        """``request``'s payload was never read by the time its answer came (the builder lm-eval
        called reached no wrapper of the probe's: one patched on meanwhile, or an ``amodel_call``
        that builds its own): what it was sent with is unknown, never the prediction. Said once."""
        with self.lock:
            request.max_tokens, request.fewest, request.is_evidence = None, None, False
            request.budget_source = UNREADABLE
        self.errors.once(
            "unread payload",
            "a request's payload was built by no payload builder the probe reads (one replaced while the run "
            "went on?): the budget it was sent with is unknown, so the trip rule does not judge it (it is counted "
            "in the evidence as unknown_budget)",
        )

    def _judged(self, max_tokens: Any) -> tuple[int | None, int | None, bool]:
        """A budget, or a tuple of those the server may use, as the rule takes it.

        Returns the largest, the fewest, and whether its observations count for the rule.
        A budget is judged as asked, however large; one that is no positive integer is unknown.
        See docs/api.md.
        """
        readings = max_tokens if isinstance(max_tokens, tuple) and max_tokens else (max_tokens,)
        known = all(type(b) is int and b > 0 for b in readings)
        largest, fewest = (max(readings), min(readings)) if known else (None, None)
        return largest, fewest, fewest is not None and fewest >= self.settings.min_max_tokens

    def failed(self, request: Request) -> None:
        """``request`` ended in an error that lm-eval may retry with a new call for the same prompts.

        The choices it flagged stay counted once, and its retry takes them over (``resume``).
        """
        if request.source is None or not request.flagged or request.observed:
            return
        with self.lock:
            request.group.retrying[id(request.source)] = request

    def resume(self, request: Request) -> None:
        """``request`` retries a flagged attempt that failed, and takes over its flags and tasks.

        So the retry's loop is not counted twice, nor are its tasks taken again.
        """
        with self.lock:
            earlier = request.group.retrying.pop(id(request.source), None)
            if earlier is None or earlier.source is not request.source or earlier.prompts != request.prompts:
                return
            request.flagged |= earlier.flagged
            request.tasks = request.tasks or earlier.tasks

    def _tasks_of_request(self, request: Request) -> list[str | None]:
        """The request's tasks, taken from the book once (under the lock)."""
        if request.tasks is None:
            request.tasks = [self.tasks.take(prompt, request.group.key) for prompt in request.prompts]
        return request.tasks

    def count_loglikelihood(self, n: int) -> None:
        with self.lock:
            self.loglikelihood_requests += n

    def blanks(self, request: Request, cancelled: bool = False) -> list[str]:
        """The blank answers of a short-circuited request (``cancelled`` in flight, or
        never sent), counted in its group and its tasks."""
        with self.lock:
            request.answered()
            request.group.short_circuited += 1
            request.group.cancelled += cancelled
            for task in self._tasks_of_request(request):
                evidence = self.tasks.of(task)
                evidence.short_circuited += 1
                evidence.cancelled += cancelled
        return blanks(request.n_answers)

    def worth_streaming(self, request: Request) -> bool:
        """Whether ``request``'s partial output should be read as it comes (streamed, or from vLLM's engine).

        Always under HYPERLOOM_EVAL_PROBE_STREAM=on; under ``auto``, only where it may bring the verdict sooner.
        """
        if self.settings.stream == "on":
            return True
        with self.lock:
            return request.group.sample.worth_watching(request.place)

    def settled(self, group: Group) -> bool:
        """Whether ``group``'s verdict is final without a trip: its sample can neither fire nor grow."""
        with self.lock:
            return group.settled

    def partial(self, request: Request, index: int, text: str, answering: bool = False) -> None:
        """More output of choice ``index`` of ``request`` has arrived (``text``: only the new part, in order).

        It feeds the choice's loop detector and files the first flag (cause ``repetition``).
        A certain flag counts as pathological for the rule, which may trip the group.
        Never raises. A no-op for a flagged, observed or unknown choice, for non-evidence requests,
        and when the detector is off.
        A trip never cancels the caller's task: a caller reads ``request.group.tripped`` afterwards.
        ``answering``: the choice has gone on from its reasoning to its answer, judged apart.
        """
        try:
            self._partial(request, index, text, answering)
        except Exception as error:
            self.errors.report("partial", error)

    def _partial(self, request: Request, index: int, text: str, answering: bool) -> None:
        settings = self.settings
        if request.budget_source == PREDICTED:  # streaming, so built and sent: never read, unknown
            self._unread(request)
        if not (settings.detector and request.is_evidence and isinstance(text, str) and text):
            return
        # A choice the request has: another index would count an observation of its own.
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < request.n_answers:
            return
        with self.lock:
            if request.observed or index in request.certain:
                return
            # The reasoning and the answer are judged apart: an answer that restates what the
            # reasoning drafted is no loop. The answer starts where the stream says so, or after
            # an inline end-of-thinking tag.
            reasoning, tag, answer = ("", "", text) if index in request.answering else text.partition(THINKING_ENDS)
            if not tag:
                reasoning, answer = ("", text) if answering or index in request.answering else (text, "")
            detector = self._detector(request, index)
            if reasoning:
                detector.feed(reasoning)
            if not detector.certain and (tag or answering) and index not in request.answering:
                request.answering.add(index)
                detector = request.detectors[index] = self._new_detector()
            if answer and not detector.certain:
                detector.feed(answer)
            if not detector.flagged:
                return
            group = request.group
            if index not in request.flagged:  # provisional: evidence, and a sign the sample leans
                request.flagged.add(index)
                self._tasks_of_request(request)
                self.tasks.of(request.task_of_choice(index)).flagged += 1
                group.tally.flag(request.budgets)
                group.sample.flag(request.place, index)
            if detector.certain:  # still looping: a pathological outcome, for the rule
                del request.detectors[index]
                request.certain.add(index)
                group.sample.record(request.place, index, True)
                self._judge(group, request)

    def _new_detector(self) -> LoopDetector:
        """A loop detector for one generation; its flag is certain after CERTAIN_UNITS units, whatever the budget."""
        settings = self.settings
        return LoopDetector(
            settings.detector_ngram, settings.detector_window, settings.detector_drift, settings.detector_threshold,
            settings.detector_repeats,
        )  # fmt: skip

    def _detector(self, request: Request, index: int) -> LoopDetector:
        detector = request.detectors.get(index)
        if detector is None:
            detector = request.detectors[index] = self._new_detector()
        return detector

    def observe(self, request: Request, response: Any) -> None:
        """Record the evidence of one response, and trip when the rule fires; never raises.

        A choice the loop detector flagged (``partial``) was counted for the rule then: here
        only how it ended is filed, apart (the detector's precision), never counted again."""
        try:
            self._record(request, response)
        except Exception as error:
            self.errors.report("observe", error)

    def _record(self, request: Request, response: Any) -> None:
        if request.observed:
            return
        if request.budget_source == PREDICTED:
            self._unread(request)
        choices = describe_choices(response, request.max_tokens, request.fewest)
        if not choices and response is not None:
            self.errors.once(
                "unreadable response",
                "a response held no generation the probe can read (no choice, OpenAI's or SGLang's, with a finish "
                "reason it reads): such generations are counted as asked for, never judged",
            )
        group = request.group
        with self.lock:
            if request.observed:  # observed meanwhile by another thread
                return
            request.observed = True
            request.answered()
            watched = set(request.detectors)  # the choices whose output the detector has read
            request.detectors.clear()
            self._tasks_of_request(request)
            for choice in choices:
                task = request.task_of_choice(choice.index)
                flagged = choice.index in request.flagged
                self.tasks.of(task).add(choice, request.budgets, request.is_evidence, flagged, choice.index in watched)
            read = {choice.index for choice in choices}
            for index in range(request.n_answers):  # nothing to judge: healthy for the sample
                if index not in read or not request.is_evidence:
                    group.sample.record(request.place, index, False)
            if not request.is_evidence:
                return
            # A flag is provisional: a flagged generation that then stopped on its own was no loop.
            for choice in choices:
                if choice.index in request.flagged and stopped_on_its_own(choice):
                    request.flagged.discard(choice.index)
                    group.tally.withdraw()
            # The gate's slow start learns from what the request's answers said; a flagged
            # choice is the pathological outcome it was flagged as.
            request.labels = [REPETITION if c.index in request.flagged else c.rule_label for c in choices]
            group.tally.add_choices([c for c in choices if c.index not in request.flagged], request.budgets)
            for choice in choices:
                pathological = choice.index in request.flagged or is_pathological(choice.rule_label)
                group.sample.record(request.place, choice.index, pathological)
            self._judge(group, request)

    def _judge(self, group: Group, request: Request) -> None:
        """Trip ``group`` when the rule fires on its sample (under the lock)."""
        if not group.tripped and not group.trip_failed and group.sample.fires():
            self._trip(group, request)

    def _trip(self, group: Group, request: Request) -> None:
        path = os.path.abspath(sidecar_path())
        figures = group.tally.as_dict()
        document = trip_document(
            TripContext(
                self.run_id, figures, group.gen_kwargs, self._tasks_of(group), self.settings,
                self.groups.first_request_at, lm_eval_version(), request.model, request.base_url, request.backend,
            )
        )  # fmt: skip
        evidence, advice = _evidence(group), cause_words(main_cause(figures["causes"]))[1]
        note_trip(self.run_id, path)
        try:
            where = self.ownership.claim(path, document)
        except Exception as error:
            note_not_applied(self.run_id)
            group.trip_failed = True
            say(
                f"TRIP NOT APPLIED: the rule fired ({evidence}), but the sidecar {path} could not be written "
                f"({error}). Evaluation continues unprobed so that no unexplained zero is produced. Set "
                "RESULT_DIR to a writable directory that holds no such file."
            )
            return
        group.tripped = True
        say(
            f"tripped: {evidence} in the group {group.key}; {where}; answering this group's remaining generate "
            f"requests with empty strings and cancelling those in flight. What to change: {advice}"
        )
        group.inflight.cancel_all()

    def _tasks_of(self, group: Group) -> list[str]:
        return sorted(self.tasks.tasks_of_group.get(group.key, set()))

    def _summary(self, group: Group) -> dict[str, Any]:
        return group.summary(set(self._tasks_of(group)))

    def final_counters(self) -> dict[str, Any]:
        """What the trip saved, for the sidecar's ``final``."""
        with self.lock:
            groups = [self._summary(g) for g in self.groups if g.tripped]
        return {
            "short_circuited_requests": sum(g["short_circuited_requests"] for g in groups),
            "cancelled_in_flight": sum(g["cancelled_in_flight"] for g in groups),
            "short_circuited_groups": groups,
        }

    def finalise(self) -> None:
        """Add the final counters to the sidecar this scope wrote (once: as its evaluation ends,
        else at exit)."""
        self.ownership.finalise({**self.final_counters(), "written_at": time.time()})

    def evidence_document(self) -> dict[str, Any]:
        """Everything this evaluation observed, per task and per group, tripped or not.

        It travels inside lm-eval's results file (see ``results``) and in the report that
        ``eval-probe run`` reads. Plain JSON; no key has the ``metric,filter`` shape that
        lm-eval's and InferenceX's readers take for a score.
        """
        with self.lock:
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
                "models": sorted(self.models),
                "run_id": self.run_id,
                "evaluation": self.evaluation,
                "pid": os.getpid(),
                "settings": self.settings.as_dict(),
                "settings_fingerprint": settings_fingerprint(self.settings),
                "sampling": self.sampling.as_dict(),
                "tripped": bool(tripped_groups),
                "sidecar": self.ownership.path,
                "tasks": dict(sorted(tasks.items())),
                "unattributed": unknown.as_dict(bool(unknown.groups & tripped_groups)) if unknown else None,
                "groups": [self._summary(group) for group in self.groups],
                "loglikelihood_requests": self.loglikelihood_requests,
            }


def _evidence(group: Group) -> str:
    tally = group.tally
    generations, _, pathological = group.sample.counts()
    caps = ",".join(str(m) for m in sorted(tally.max_tokens)) or "not recorded"
    what = cause_words(main_cause(tally.causes))[0]
    flagged = f"; {tally.flagged} flagged looping before they ended" if tally.flagged else ""
    return (
        f"{pathological} of the {generations} sampled generations {what} "
        f"(finish reasons {dict(tally.reasons)}{flagged}) at max_tokens={caps}"
    )


class EndedEvaluation:
    """What the exit needs of an ended evaluation: its evidence document and its final
    counters. Its scope (every prompt, every request) is let go."""

    def __init__(self, probe: Probe) -> None:
        self._document = probe.evidence_document()
        self._final = probe.final_counters()
        self._ownership = probe.ownership
        self.reported = False  # its final counters and report entry written (``report.settle``)

    def idle(self) -> bool:
        return False

    def evidence_document(self) -> dict[str, Any]:
        return self._document

    def finalise(self) -> None:
        self._ownership.finalise({**self._final, "written_at": time.time()})


# The process's default scope (requests made outside any evaluation: lm-eval's models driven
# directly), else the evaluation begun last; None while the probe is off. The wrappers ask
# :func:`active`, which prefers the evaluation the calling thread (or task) runs in.
ACTIVE: Probe | None = None
# Every scope this process had, oldest first, an ended evaluation's as what the exit needs
# of it: the report at exit and the final counters.
SCOPES: list[Probe | EndedEvaluation] = []
# The scope of the evaluation that the current thread or asyncio task runs in (None: one run
# with the probe off); _OUTSIDE when it runs in none. A context variable, so that two
# evaluations run by two threads never use each other's scope (asyncio.run and every task
# copy it); a thread an evaluation starts itself falls back on ACTIVE.
_OUTSIDE = object()
_EVALUATION: contextvars.ContextVar[Any] = contextvars.ContextVar("lm_eval_probe_evaluation", default=_OUTSIDE)


def active() -> Probe | None:
    """The scope the wrappers use now: the running evaluation's, else ACTIVE."""
    scope = _EVALUATION.get()
    return ACTIVE if scope is _OUTSIDE else scope


def in_evaluation() -> bool:
    """Whether the caller runs inside an evaluation (whose scope it must not replace)."""
    return _EVALUATION.get() is not _OUTSIDE


def activate(settings: Settings) -> Probe:
    """The active scope, made (as the process's default scope) when there is none."""
    global ACTIVE
    if ACTIVE is None:
        ACTIVE = Probe(settings)
        SCOPES.append(ACTIVE)
    return ACTIVE


def begin_evaluation(settings: Settings) -> Probe:
    """Start the scope of a new evaluation and make it the active one; an idle default scope
    (made when lm-eval was imported) is dropped, since it never saw anything."""
    global ACTIVE
    if ACTIVE is not None and not ACTIVE.evaluation and ACTIVE.idle() and ACTIVE in SCOPES:
        SCOPES.remove(ACTIVE)
    ACTIVE = Probe(settings, evaluation=True)
    SCOPES.append(ACTIVE)
    return ACTIVE


def enter(probe: Probe | None) -> contextvars.Token:
    """The caller runs the evaluation of ``probe`` (None: unprobed) until :func:`leave`."""
    return _EVALUATION.set(probe)


def leave(token: contextvars.Token, probe: Probe | None, settings: Settings | None) -> EndedEvaluation | None:
    """The evaluation entered with ``token`` ended.

    What runs after it, outside any evaluation, gets a fresh default scope under ``settings``.
    ``settings`` None means the probe is off. The ended evaluation's groups and trips are never reused.
    Returns what is kept of the ended evaluation.
    None when it was unprobed or could not be summed up; its whole scope is then kept for the exit.
    """
    global ACTIVE
    _EVALUATION.reset(token)
    if probe is not None and ACTIVE is probe:
        ACTIVE = None
        if settings is not None and settings.enabled:
            activate(settings)
    if probe is None or probe not in SCOPES:
        return None
    ended = EndedEvaluation(probe)
    SCOPES[SCOPES.index(probe)] = ended
    return ended


def end_probing() -> None:
    """The probe is off from now on: no scope is active (the scopes so far are kept)."""
    global ACTIVE
    ACTIVE = None


def forked() -> None:
    """In a forked child: the scopes it inherited are its parent's to report, not its own."""
    for scope in SCOPES:
        scope.reported = True


def forget() -> None:
    """Forget every scope (the probe is uninstalled)."""
    end_probing()
    SCOPES.clear()
