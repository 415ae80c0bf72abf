"""Glue for lm-eval's in-process vLLM backend (``--model vllm``): invasive patches.

The probe works inside vLLM's engine loop, on each ``LLM.generate`` call, sample first.
The slow start holds ``add_request``; ``step`` hands over finished requests and partial output.
A trip aborts the group's unfinished requests, and lm-eval gets a blank answer for each.
An engine that cannot be hooked runs unprobed, said once; loglikelihood is never touched.
Data-parallel replicas are ``replicas`` and ``replica_engine``. See docs/vllm-offline.md.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from probe.runtime.core.answers import BLANK, BlankAnswer
from probe.runtime.core.streaming import wanted
from probe.runtime.hooking.integration import Integration
from probe.runtime.hooking.patching import is_ours_within, mark, replace, restore_where, wrap
from probe.runtime.hooking.versions import LM_EVAL, VLLM
from probe.runtime.inprocess.model import OfflineModel
from probe.runtime.inprocess.order import install_order, sampled_order
from probe.runtime.scope import state
from probe.runtime.scope.groups import Group, Request
from probe.runtime.scope.log import say
from probe.runtime.scope.observer import Observer
from probe.runtime.vllm import replicas
from probe.runtime.vllm.engine_slow_start import AddFailed, EngineSlowStart
from probe.runtime.vllm.vllm_partial import STREAM_INTERVAL, new_text, watched_params

BACKEND = "vllm"
ENGINE_METHODS = ("add_request", "step", "abort_request", "has_unfinished_requests", "get_num_unfinished_requests")
ENGINE_HOOKS = ("step", "add_request", "get_num_unfinished_requests")  # the engine class's methods wrapped
MODEL_GENERATE_PARAMETERS = ["self", "requests", "generate", "sampling_params"]


@dataclass
class BlankOutput:
    """In place of the ``RequestOutput`` of a request the probe aborted or never sent:
    lm-eval reads ``outputs[0].text``, a blank answer that both caches refuse."""

    request_id: str
    text: BlankAnswer = BLANK

    @property
    def outputs(self) -> list[BlankOutput]:
        return [self]


@dataclass
class Prompts:
    """One ``generate_until`` call's prompts, in the order ``modify_gen_kwargs`` sees them.

    Each prompt of a chunk comes once, with its own ``gen_kwargs``.
    That dict's identity tells its task, since each lm-eval ``Instance`` holds its own.
    """

    task_of: dict[int, str | None]
    gen_kwargs: list[Any] = field(default_factory=list)
    tasks: list[str | None] = field(default_factory=list)  # aligned with gen_kwargs

    def take(self) -> tuple[list[Any], list[str | None]]:
        """The prompts seen since the last call, for the chunk about to be generated."""
        taken = self.gen_kwargs, self.tasks
        self.gen_kwargs, self.tasks = [], []
        return taken


@dataclass
class EngineCall:
    """One ``LLM.generate`` call followed through the engine: which request is which."""

    probe: Observer  # the evaluation's scope, or a replica's stand-in
    engine: Any
    requests: list[Request]
    ids: list[str] = field(default_factory=list)  # engine request ids, in the order added
    index: dict[str, int] = field(default_factory=dict)  # made once: the engine steps thousands of times
    finished: set[str] = field(default_factory=set)
    aborted: set[str] = field(default_factory=set)
    handled: set[int] = field(default_factory=set)  # the tripped groups already aborted
    watch: bool = False  # whether to ask the engine for partial outputs (vllm_partial)
    seen: dict[tuple[int, int], int] = field(default_factory=dict)  # (prompt, choice): characters fed
    read_at: dict[tuple[int, int], int] = field(default_factory=dict)  # (prompt, choice): tokens when last read
    slow: EngineSlowStart | None = None  # None: every request goes to the engine when LLM.generate adds it

    def sampling_params(self, params: Any, request: Request) -> Any:
        """The parameters to give the engine for ``request``: a copy that reports partial outputs
        where allowed and worth it (``Probe.worth_streaming``), else ``params`` (said once)."""
        if not (self.watch and self.probe.worth_streaming(request)):
            return params
        watched, why = watched_params(params)
        if why:
            self.probe.errors.once(
                "vllm partial", f"vLLM's partial outputs cannot be watched ({why}); the probe judges finished "
                "generations only, as without the degeneration detector",
            )  # fmt: skip
        return watched

    def after_step(self, outputs: Any) -> None:
        """Observe the requests that finished in this step and feed the partial outputs of the
        others, then abort what a trip ends."""
        if len(self.ids) != len(self.requests):  # nothing can be told apart: nothing is touched
            self.unplaced(f"{len(self.ids)} engine requests for {len(self.requests)} prompts")
            return
        self.index = self.index or {request_id: i for i, request_id in enumerate(self.ids)}
        groups: dict[int, Group] = {}
        for output in outputs or ():
            i = self.index.get(str(getattr(output, "request_id", None)))
            if i is None:
                self.unplaced(f"a request with the unknown id {getattr(output, 'request_id', None)!r}")
                continue
            if self.ids[i] in self.finished:
                continue
            request = self.requests[i]
            groups.setdefault(id(request.group), request.group)
            if getattr(output, "finished", False):
                self.finished.add(self.ids[i])
                self.probe.observe(request, as_response(output))
                if self.slow is not None:
                    self.slow.finished(request.group, request.labels)
            else:
                self.partial(i, output)
        for key, group in groups.items():  # after the whole step: what finished in it keeps its answer
            if group.tripped and key not in self.handled:
                self.handled.add(key)
                self.abort(group)

    def admit(self) -> None:
        """Add to the engine the held requests the slow start now allows (see
        ``engine_slow_start``); an error from the engine's ``add_request`` propagates."""
        slow = self.slow
        if slow is None:
            return
        try:
            self._admit(slow)
        except AddFailed as failed:
            # As LLM.generate does when an add fails: what this call put in the engine is aborted.
            sent = self.in_engine()
            if sent:
                self.engine.abort_request(sent)
            raise (failed.__cause__ or failed) from None

    def _admit(self, slow: EngineSlowStart) -> None:
        try:
            slow.admit(self.engine.has_unfinished_requests)
        except AddFailed:
            raise
        except Exception as error:  # the probe's own: nothing may stay held, so all of it goes
            self.probe.errors.report("vllm slow start", error)
            slow.release_all()

    def in_engine(self, group: Group | None = None) -> list[str]:
        """The engine ids of this call's unfinished requests that were sent (of ``group``, or all)."""
        unsent = self.slow.waiting | self.slow.never_sent if self.slow is not None else set()
        return [
            request_id
            for place, (request_id, request) in enumerate(zip(self.ids, self.requests, strict=True))
            if (group is None or request.group is group) and request_id not in self.finished and place not in unsent
        ]

    def partial(self, i: int, output: Any) -> None:
        """Feed the new text of the unfinished request ``i``'s choices to the probe."""
        for completion in getattr(output, "outputs", None) or ():
            choice, text = getattr(completion, "index", 0), getattr(completion, "text", None)
            if not isinstance(choice, int) or not isinstance(text, str):
                continue
            # vLLM reports a cumulative request at every step, whatever its stream_interval:
            # read it every STREAM_INTERVAL tokens (every report when it has no token ids).
            tokens = len(getattr(completion, "token_ids", None) or ())
            if tokens and tokens - self.read_at.get((i, choice), 0) < STREAM_INTERVAL:
                continue
            self.read_at[(i, choice)] = tokens
            added = new_text(self.seen.get((i, choice), 0), text)
            if added:
                self.seen[(i, choice)] = len(text)
                self.probe.partial(self.requests[i], choice, added)

    def unplaced(self, what: str) -> None:
        self.probe.errors.once(
            "vllm unplaced", f"cannot match vLLM's engine requests to lm-eval's prompts ({what}); not observed"
        )

    def abort(self, group: Group) -> None:
        """End every unfinished request of ``group`` in the engine, at once."""
        doomed = self.in_engine(group)
        if doomed:
            self.engine.abort_request(doomed)
            self.aborted.update(doomed)

    def answers(self, outputs: list[Any]) -> list[Any]:
        """``outputs`` with a blank in place of each aborted request and of each the slow start
        never sent, in prompt order."""
        never_sent = self.slow.never_sent if self.slow is not None else set()
        if not self.aborted and not never_sent:
            return outputs
        by_id = {str(getattr(output, "request_id", None)): output for output in outputs}
        answers: list[Any] = []
        for place, (request_id, request) in enumerate(zip(self.ids, self.requests, strict=True)):
            if request_id in self.aborted or place in never_sent:
                self.probe.blanks(request, cancelled=place not in never_sent)
                answers.append(BlankOutput(request_id))
            else:
                answers.append(by_id[request_id])
        return answers


def as_response(output: Any) -> dict[str, Any]:
    """A finished ``RequestOutput`` as the OpenAI-shaped response the evidence rules read."""
    completions = list(getattr(output, "outputs", None) or ())
    return {
        "choices": [
            {"index": i, "finish_reason": getattr(c, "finish_reason", None), "text": getattr(c, "text", "")}
            for i, c in enumerate(completions)
        ],
        "usage": {"completion_tokens": sum(len(getattr(c, "token_ids", None) or ()) for c in completions)},
    }


# The generate_until call and the engine call running now; any other use of an engine
# (another LLM object, another thread) finds them unset and is left alone.
_PROMPTS: contextvars.ContextVar[Prompts | None] = contextvars.ContextVar("lm_eval_probe_prompts", default=None)
CURRENT_CALL: contextvars.ContextVar[EngineCall | None] = contextvars.ContextVar(
    "lm_eval_probe_engine_call", default=None
)
_UNHOOKABLE: set[type] = set()  # engine classes that could not be hooked: said once, not retried


def _probed_generate_until(original: Callable, vllm_causallms: Any = None) -> Callable:
    def generate_until(self: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
        prompts, probe = None, state.active()
        if probe is not None:
            try:
                probe.register(requests)
                prompts = Prompts({id(r.args[1]): getattr(r, "task_name", None) for r in requests})
            except Exception as error:
                probe.errors.report("vllm generate_until", error)
        token = _PROMPTS.set(prompts)
        try:
            seed = probe.sampling.seed if probe is not None and prompts is not None else None
            with sampled_order(seed, vllm_causallms, reserve=probe.reserve if probe is not None else 0):
                return original(self, requests, *args, **kwargs)
        finally:
            _PROMPTS.reset(token)

    return mark(generate_until, original)


def _recording_modify_gen_kwargs(original: Callable) -> Callable:
    def modify_gen_kwargs(gen_kwargs: Any, *args: Any, **kwargs: Any) -> Any:
        prompts = _PROMPTS.get()
        if prompts is not None:
            prompts.gen_kwargs.append(gen_kwargs)
            prompts.tasks.append(prompts.task_of.get(id(gen_kwargs)))
        return original(gen_kwargs, *args, **kwargs)

    return mark(modify_gen_kwargs, original)


def _probed_model_generate(original: Callable, vllm_causallms: Any = None) -> Callable:
    def _model_generate(
        self: Any, requests: Any = None, generate: bool = False, sampling_params: Any = None, **kwargs: Any
    ) -> Any:
        prompts = _PROMPTS.get()
        gen_kwargs, tasks = prompts.take() if prompts is not None else ([], [])
        probe, watched = state.active(), None
        if probe is not None and generate and isinstance(sampling_params, list):
            watched = _watch(probe, self, requests, sampling_params, gen_kwargs, tasks)
        if probe is None or watched is None:  # unprobed: loglikelihood, the probe off, or as _watch said
            return original(self, requests, generate, sampling_params, **kwargs)
        engine, planned = watched
        answers: list[Any] = [BlankOutput(f"not-sent-{i}") for i in range(len(requests))]
        send = []
        for i, request in enumerate(planned):
            if request.group.tripped:  # in an earlier chunk: never sent
                probe.blanks(request)
            else:
                send.append(i)
        if send:
            sent, params = [requests[i] for i in send], [sampling_params[i] for i in send]
            if engine is None:  # data parallel: each replica's engine is watched in its own process
                outputs, blanked = replicas.generate_across(
                    probe, [planned[i] for i in send], params,
                    lambda tagged: original(self, sent, generate, tagged, **kwargs), _runs_on_ray(self, vllm_causallms),
                )  # fmt: skip
                given = [BlankOutput(f"replica-{j}") if j in blanked else out for j, out in enumerate(outputs)]
            else:
                in_engine = [planned[i] for i in send]
                call = EngineCall(probe, engine, in_engine, watch=wanted(probe.settings, in_engine))
                call.slow = _slow_start(probe, engine, in_engine)
                token = CURRENT_CALL.set(call)
                try:
                    outputs = original(self, sent, generate, params, **kwargs)
                finally:
                    CURRENT_CALL.reset(token)
                given = call.answers(list(outputs))
            for i, answer in zip(send, given, strict=True):
                answers[i] = answer
        return answers

    return mark(_model_generate, original)


def _slow_start(probe: state.Probe, engine: Any, requests: list[Request]) -> EngineSlowStart | None:
    """The slow start of one engine call, where the knob applies it; None (said) on an error."""
    try:
        width = getattr(getattr(getattr(engine, "vllm_config", None), "scheduler_config", None), "max_num_seqs", None)
        return EngineSlowStart.for_engine(probe.settings, width, any(r.is_evidence for r in requests))
    except Exception as error:
        probe.errors.report("vllm slow start", error)
        return None


def _runs_on_ray(lm: Any, vllm_causallms: Any) -> bool:
    """Whether lm-eval sends the replicas' shares to Ray tasks: always in 0.4.13; in 0.4.9.2
    and b315ef3 only for vLLM's old engine (``V1`` false), else to multiprocessing workers."""
    return not hasattr(vllm_causallms, "_vllm_mp_worker") or not getattr(lm, "V1", True)


def _watch(
    probe: state.Probe, lm: Any, prompts: Any, params: list, gen_kwargs: list, tasks: list
) -> tuple[Any | None, list[Request]] | None:
    """The hooked engine (None with data parallelism: the replicas hook theirs) and this
    chunk's requests, registered; None when it runs unprobed."""
    try:
        if not len(gen_kwargs) == len(tasks) == len(params) == len(prompts):
            probe.errors.once(
                "vllm prompts",
                f"cannot tell the settings of each prompt ({len(gen_kwargs)} for {len(prompts)} prompts); "
                "lm-eval's vLLM backend runs unprobed",
            )
            return None
        engine = None
        if getattr(lm, "data_parallel_size", 1) <= 1:
            engine = hook_engine(getattr(lm, "model", None))
            if engine is None:
                return None
        model_args = getattr(lm, "model_args", None)
        model = OfflineModel(str(model_args.get("model")) if isinstance(model_args, dict) else None)
        requests = []
        for i, sampling in enumerate(params):
            max_tokens = getattr(sampling, "max_tokens", None)
            requests.append(probe.request(model, gen_kwargs[i], [None], max_tokens, backend=BACKEND, tasks=[tasks[i]]))
        return engine, requests
    except Exception as error:
        probe.errors.report("vllm _model_generate", error)
        return None


def _observing_step(original: Callable) -> Callable:
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        outputs = original(self, *args, **kwargs)
        call = CURRENT_CALL.get()
        if call is not None and call.engine is self:
            try:
                call.after_step(outputs)
            except Exception as error:
                call.probe.errors.report("vllm step", error)
            call.admit()  # outside: the engine's own error from a held add_request is lm-eval's
        return outputs

    return mark(step, original)


def _recording_add_request(original: Callable) -> Callable:
    def add_request(self: Any, request_id: Any, *args: Any, **kwargs: Any) -> Any:
        call = CURRENT_CALL.get()
        ours = call is not None and call.engine is self and len(call.ids) < len(call.requests)
        if not ours:
            return original(self, request_id, *args, **kwargs)
        place = len(call.ids)
        request = call.requests[place]
        args, kwargs = _with_watched_params(call, request, args, kwargs)
        add = partial(original, self, request_id, *args, **kwargs)
        if call.slow is not None and not call.slow.offer(place, request.group, add, request.is_evidence):
            call.ids.append(str(request_id))
            return str(request_id)  # held: the id LLM.generate gave it, as the engine returns it
        added = add()
        call.ids.append(str(request_id))
        return added

    return mark(add_request, original)


def _counting_held(original: Callable) -> Callable:
    def get_num_unfinished_requests(self: Any, *args: Any, **kwargs: Any) -> Any:
        # LLM.generate sizes its progress bar with this before its first step: the held count.
        count = original(self, *args, **kwargs)
        call = CURRENT_CALL.get()
        if call is not None and call.engine is self and call.slow is not None and isinstance(count, int):
            try:
                return count + len(call.slow.waiting)
            except Exception as error:
                call.probe.errors.report("vllm progress count", error)
        return count

    return mark(get_num_unfinished_requests, original)


def _with_watched_params(call: EngineCall, request: Request, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``add_request``'s arguments after the request id, with the sampling parameters (the
    second, ``params``) swapped for the call's own copy for ``request``; as given when that fails."""
    try:
        if len(args) >= 2:
            return (args[0], call.sampling_params(args[1], request), *args[2:]), kwargs
        if "params" in kwargs:
            return args, {**kwargs, "params": call.sampling_params(kwargs["params"], request)}
    except Exception as error:
        call.probe.errors.report("vllm add_request", error)
    return args, kwargs


def hook_engine(llm: Any) -> Any:
    """The engine ``llm`` drives, its class hooked (once; only now is the class known);
    None, said once, when it cannot be."""
    engine = getattr(llm, "llm_engine", None)
    cls = type(engine)
    if cls in _UNHOOKABLE:
        return None
    try:
        missing = [name for name in ENGINE_METHODS if not callable(getattr(engine, name, None))]
        if missing:
            raise LookupError(f"{cls.__module__}.{cls.__qualname__} has no {', '.join(missing)}")
        hooks = dict(zip(ENGINE_HOOKS, (_observing_step, _recording_add_request, _counting_held), strict=True))
        for name, make in hooks.items():
            wrap(next(c for c in cls.__mro__ if name in c.__dict__), name, make)
        return engine
    except Exception as error:
        _UNHOOKABLE.add(cls)
        say(f"could not hook vLLM's engine ({error!r}); lm-eval's vLLM backend runs unprobed")
        return None


def _keeping_blank_answers(original: Callable) -> Callable:
    def postprocess_generated_text(generation: Any, *args: Any, **kwargs: Any) -> Any:
        # lm-eval cuts stop sequences off with str.split, which would turn a blank answer
        # into a plain "" that both cache layers would then store as the model's answer.
        if isinstance(generation, BlankAnswer):
            return generation
        return original(generation, *args, **kwargs)

    return mark(postprocess_generated_text, original)


def install_vllm(vllm_causallms: Any) -> None:
    """Patch lm-eval's ``VLLM`` backend (idempotent); its engine is hooked at first use.

    Raises LookupError, having patched nothing, when lm-eval's module lacks what is hooked.
    """
    cls = vllm_causallms.VLLM
    generate = cls.__dict__.get("_model_generate")
    modify = cls.__dict__.get("modify_gen_kwargs")
    if not (
        "generate_until" in cls.__dict__
        and inspect.isfunction(generate)
        and list(inspect.signature(generate).parameters)[:4] == MODEL_GENERATE_PARAMETERS
        and isinstance(modify, staticmethod)
        and callable(getattr(vllm_causallms, "postprocess_generated_text", None))
    ):
        raise LookupError(f"lm-eval's VLLM class is not as this probe knows it (tested with {LM_EVAL.releases()})")
    install_order(vllm_causallms)
    wrap(cls, "generate_until", partial(_probed_generate_until, vllm_causallms=vllm_causallms))
    wrap(cls, "_model_generate", partial(_probed_model_generate, vllm_causallms=vllm_causallms))
    if not is_ours_within(modify):
        replace(cls, "modify_gen_kwargs", staticmethod(_recording_modify_gen_kwargs(modify.__func__)))
    wrap(vllm_causallms, "postprocess_generated_text", _keeping_blank_answers)


def uninstall_vllm(vllm_causallms: Any) -> None:
    """Restore lm-eval's ``VLLM`` backend and every engine class hooked at first use."""
    cls = vllm_causallms.VLLM
    restore_where(lambda owner, name: owner is cls or owner is vllm_causallms or name in ENGINE_HOOKS)


INTEGRATION = Integration(
    waits_for="lm_eval.models.vllm_causallms",
    install=install_vllm,
    uninstall=uninstall_vllm,
    tested=(LM_EVAL, VLLM),
    unprobed="lm-eval's vLLM backend",
)
