"""Glue for lm-eval's in-process vLLM backend (``--model vllm``): invasive patches.

lm-eval's ``VLLM.generate_until`` hands each chunk of prompts (all of a run's prompts with
``--batch_size auto``) to ``_model_generate``, which calls ``LLM.generate``; vLLM then adds
one engine request per prompt and loops ``llm_engine.step()`` until none is unfinished.
Looking at what ``generate`` returns would be too late, so the probe works in that loop:

- ``llm_engine.add_request`` tells it the engine's id of each prompt, in order;
- ``llm_engine.step`` hands it every request as it finishes (its ``finish_reason`` and token
  count against its ``max_tokens``), which is observed like an API response;
- on a trip, ``llm_engine.abort_request`` ends every unfinished request of the tripped
  group at once (freeing its KV cache), and each gets a blank answer in its place, so
  lm-eval receives one answer per prompt, in order, and finishes normally;
- a prompt of a group that tripped in an earlier chunk is never sent.

The engine is found by what it does, not by vLLM's version: whatever object ``LLM`` keeps
as ``llm_engine`` and drives through those three methods (``_run_engine`` in
``vllm/entrypoints/common/offline.py`` in 0.32). When it lacks them, or hooking it fails,
one line says so and generation runs unprobed. Loglikelihood requests are never touched.

``data_parallel_size > 1``: lm-eval then runs one engine per Ray worker, in processes that
need not import lm-eval, so the probe cannot see inside them; generation runs unprobed,
with one line that says so. Nothing in that path is changed.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from probe.runtime import state
from probe.runtime.answers import BLANK, ShortCircuitAnswer
from probe.runtime.contract import version_tuple
from probe.runtime.groups import Group, Request
from probe.runtime.log import say
from probe.runtime.patching import is_ours, mark, replace, wrap

BACKEND = "vllm"
# What the probe needs from the engine that LLM.generate drives (see the module docstring).
ENGINE_METHODS = ("add_request", "step", "abort_request")
# The vLLM releases the test suite runs against; others get one warning, and run probed.
TESTED_VLLM = ((0, 32, 0), (0, 32, 0))


@dataclass(frozen=True)
class OfflineModel:
    """What the sidecar says about the model: its path, and no server (there is none)."""

    model: str | None
    base_url: None = None


@dataclass
class Prompts:
    """The prompts of one ``generate_until`` call, as ``modify_gen_kwargs`` sees them.

    lm-eval calls ``modify_gen_kwargs`` once per prompt of a chunk, in the chunk's order,
    with that prompt's own ``gen_kwargs``; ``_model_generate`` then takes them, aligned with
    its prompts. The task of a prompt is found through its ``gen_kwargs`` (each lm-eval
    ``Instance`` holds its own dict).
    """

    task_of: dict[int, str | None]
    pending: list[tuple[Any, str | None]] = field(default_factory=list)

    def take(self) -> list[tuple[Any, str | None]]:
        taken, self.pending = self.pending, []
        return taken


@dataclass
class BlankOutput:
    """Stands in for the ``RequestOutput`` of a request the probe aborted or never sent.

    lm-eval reads only ``outputs[0].text``: a blank answer that both caches refuse.
    """

    request_id: str
    text: ShortCircuitAnswer = BLANK
    finished: bool = True

    @property
    def outputs(self) -> list[BlankOutput]:
        return [self]


@dataclass
class EngineCall:
    """One ``LLM.generate`` call followed through the engine: which request is which."""

    probe: state.Probe
    engine: Any
    requests: list[Request]
    ids: list[str] = field(default_factory=list)  # engine request ids, in the order added
    finished: set[str] = field(default_factory=set)
    aborted: set[str] = field(default_factory=set)
    handled: set[int] = field(default_factory=set)  # ids of tripped groups already aborted
    index: dict[str, int] = field(default_factory=dict)  # engine request id -> prompt

    def added(self, request_id: Any) -> None:
        if len(self.ids) < len(self.requests):
            self.ids.append(str(request_id))

    def after_step(self, outputs: Any) -> None:
        """Observe the requests that finished in this step; abort a tripped group's others."""
        if len(self.ids) != len(self.requests):
            return  # not one id per prompt: nothing can be told apart, so nothing is touched
        if not self.index:  # made once: the engine steps thousands of times per call
            self.index = {request_id: i for i, request_id in enumerate(self.ids)}
        tripped: list[Group] = []
        for output in outputs or ():
            i = self.index.get(str(getattr(output, "request_id", None)))
            if i is None or not getattr(output, "finished", False) or self.ids[i] in self.finished:
                continue
            self.finished.add(self.ids[i])
            request = self.requests[i]
            self.probe.observe(request, as_response(output))
            if request.group.tripped and id(request.group) not in self.handled:
                tripped.append(request.group)
        for group in tripped:
            self.handled.add(id(group))
            self.abort(group)

    def abort(self, group: Group) -> None:
        """End every unfinished request of ``group`` in the engine, at once."""
        doomed = [
            request_id
            for request_id, request in zip(self.ids, self.requests, strict=True)
            if request.group is group and request_id not in self.finished and request_id not in self.aborted
        ]
        if not doomed:
            return
        self.engine.abort_request(doomed)
        self.aborted.update(doomed)
        with self.probe.groups.lock:
            group.cancelled += len(doomed)

    def answers(self, outputs: Sequence[Any]) -> list[Any]:
        """``outputs`` with a blank stand-in for each aborted request, in prompt order."""
        if not self.aborted:
            return list(outputs)
        by_id = {str(getattr(output, "request_id", None)): output for output in outputs}
        answers: list[Any] = []
        for request_id, request in zip(self.ids, self.requests, strict=True):
            if request_id in self.aborted:
                self.probe.blanks(request)
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


# The generate_until call and the engine call running now. lm-eval drives vLLM's offline
# engine from one thread, but a context variable keeps any other caller's engine untouched.
_PROMPTS: contextvars.ContextVar[Prompts | None] = contextvars.ContextVar("lm_eval_probe_prompts", default=None)
_CALL: contextvars.ContextVar[EngineCall | None] = contextvars.ContextVar("lm_eval_probe_engine_call", default=None)
# Engine classes that could not be hooked: said once, never retried.
_UNHOOKABLE: set[type] = set()


def _probed_generate_until(original: Callable) -> Callable:
    def generate_until(self: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
        prompts = None
        if state.ACTIVE is not None:
            try:
                prompts = Prompts({id(r.args[1]): getattr(r, "task_name", None) for r in requests})
            except Exception as error:
                state.ACTIVE.errors.report("vllm generate_until", error)
        token = _PROMPTS.set(prompts)
        try:
            return original(self, requests, *args, **kwargs)
        finally:
            _PROMPTS.reset(token)

    return mark(generate_until, original)


def _recording_modify_gen_kwargs(original: Callable) -> Callable:
    def modify_gen_kwargs(gen_kwargs: Any, *args: Any, **kwargs: Any) -> Any:
        prompts = _PROMPTS.get()
        if prompts is not None:
            prompts.pending.append((gen_kwargs, prompts.task_of.get(id(gen_kwargs))))
        return original(gen_kwargs, *args, **kwargs)

    return mark(modify_gen_kwargs, original)


def _probed_model_generate(original: Callable) -> Callable:
    def _model_generate(self: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
        probe, plan = _plan(self, original, requests, args, kwargs)
        if plan is None:
            return original(self, requests, *args, **kwargs)
        return _generate(probe, plan, original, self, requests, args, kwargs)

    return mark(_model_generate, original)


@dataclass
class Plan:
    """What the probe does with one chunk: its requests, and which prompts go to the engine."""

    engine: Any
    requests: list[Request]
    sampling_params: list[Any]
    send: list[int]  # indices of the prompts whose group has not tripped
    tasks: list[str | None]  # the task of each prompt (lm-eval's Instance.task_name)


def _plan(
    lm: Any, original: Callable, requests: Any, args: tuple, kwargs: dict
) -> tuple[state.Probe | None, Plan | None]:
    """The probe and its plan for this chunk; (probe, None) when the chunk runs unprobed."""
    probe = state.ACTIVE
    prompts = _PROMPTS.get()
    if probe is None:
        return None, None
    try:
        bound = inspect.signature(original).bind(lm, requests, *args, **kwargs).arguments
        sampling_params = bound.get("sampling_params")
        if not bound.get("generate") or not isinstance(sampling_params, list):
            return probe, None  # loglikelihood: emits no tokens, never touched
        pending = prompts.take() if prompts is not None else []
        if getattr(lm, "data_parallel_size", 1) > 1:
            probe.errors.once(
                "vllm data parallel",
                "data_parallel_size > 1: lm-eval runs one vLLM engine per Ray worker, out of the "
                "probe's reach; generation runs unprobed",
            )
            return probe, None
        if len(pending) != len(requests) or len(sampling_params) != len(requests):
            probe.errors.once(
                "vllm prompts",
                f"cannot tell the settings of each prompt ({len(pending)} for {len(requests)} prompts); "
                "this lm-eval's vLLM backend runs unprobed",
            )
            return probe, None
        engine = _hook_engine(probe, getattr(lm, "model", None))
        if engine is None:
            return probe, None
        model = OfflineModel(_model_name(lm))
        tasks = [task for _, task in pending]  # aligned with the prompts, like sampling_params
        planned = []
        for i, params in enumerate(sampling_params):
            max_tokens = getattr(params, "max_tokens", None)
            # per-task: tasks=[tasks[i]]
            planned.append(probe.request(model, pending[i][0], 1, max_tokens, backend=BACKEND))
        send = [i for i, request in enumerate(planned) if not request.group.tripped]
        return probe, Plan(engine, planned, sampling_params, send, tasks)
    except Exception as error:
        probe.errors.report("vllm _model_generate", error)
        return probe, None


def _generate(
    probe: state.Probe, plan: Plan, original: Callable, lm: Any, requests: Any, args: tuple, kwargs: dict
) -> list[Any]:
    """Run the chunk's untripped prompts through the engine, watched; blanks for the rest."""
    answers: list[Any] = [None] * len(plan.requests)
    sent_indices = set(plan.send)
    for i, request in enumerate(plan.requests):
        if i not in sent_indices:
            probe.blanks(request)
            answers[i] = BlankOutput(f"lm-eval-probe-{i}")
    if plan.send:
        call = EngineCall(probe, plan.engine, [plan.requests[i] for i in plan.send])
        sent = [requests[i] for i in plan.send]
        params = [plan.sampling_params[i] for i in plan.send]
        args, kwargs = _with_sampling_params(original, lm, sent, args, kwargs, params)
        token = _CALL.set(call)
        try:
            outputs = original(lm, sent, *args, **kwargs)
        finally:
            _CALL.reset(token)
        for i, answer in zip(plan.send, call.answers(outputs), strict=True):
            answers[i] = answer
    return answers


def _with_sampling_params(
    original: Callable, lm: Any, requests: Any, args: tuple, kwargs: dict, params: list[Any]
) -> tuple[tuple, dict]:
    """The call's arguments with ``sampling_params`` replaced, wherever it was passed."""
    bound = inspect.signature(original).bind(lm, requests, *args, **kwargs)
    bound.arguments["sampling_params"] = params
    return bound.args[2:], bound.kwargs


def _model_name(lm: Any) -> str | None:
    model_args = getattr(lm, "model_args", None)
    name = model_args.get("model") if isinstance(model_args, dict) else None
    return str(name) if name is not None else None


def _observing_step(original: Callable) -> Callable:
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        outputs = original(self, *args, **kwargs)
        call = _CALL.get()
        if call is not None and call.engine is self:
            try:
                call.after_step(outputs)
            except Exception as error:
                call.probe.errors.report("vllm step", error)
        return outputs

    return mark(step, original)


def _recording_add_request(original: Callable) -> Callable:
    def add_request(self: Any, request_id: Any, *args: Any, **kwargs: Any) -> Any:
        added = original(self, request_id, *args, **kwargs)
        call = _CALL.get()
        if call is not None and call.engine is self:
            call.added(request_id)
        return added

    return mark(add_request, original)


def _hook_engine(probe: state.Probe, llm: Any) -> Any:
    """The engine ``llm`` drives, with its class hooked (once); None when it cannot be.

    Hooked at the first generate call, because only then is the engine's class known.
    """
    engine = getattr(llm, "llm_engine", None)
    cls = type(engine)
    if cls in _UNHOOKABLE:
        return None
    try:
        missing = [name for name in ENGINE_METHODS if not callable(getattr(engine, name, None))]
        if missing:
            raise LookupError(f"{cls.__module__}.{cls.__qualname__} has no {', '.join(missing)}")
        _wrap_along_mro(cls, "step", _observing_step)
        _wrap_along_mro(cls, "add_request", _recording_add_request)
        _warn_untested_vllm(probe)
        return engine
    except Exception as error:
        _UNHOOKABLE.add(cls)
        say(f"could not hook vLLM's engine ({error!r}); lm-eval's vLLM backend runs unprobed")
        return None


def _wrap_along_mro(cls: type, name: str, make: Callable[[Callable], Callable]) -> None:
    """Wrap ``name`` where ``cls`` finds it: on the class along its MRO that defines it."""
    for owner in cls.__mro__:
        if name in owner.__dict__:
            wrap(owner, name, make)
            return


def _warn_untested_vllm(probe: state.Probe) -> None:
    try:
        import vllm

        version = str(vllm.__version__)
    except Exception:
        return
    found = version_tuple(version)
    low, high = TESTED_VLLM
    if found is None or not (low <= found[:3] <= high):
        text = " to ".join(dict.fromkeys(".".join(map(str, v)) for v in TESTED_VLLM))
        probe.errors.once(
            "vllm version",
            f"vLLM {version} is outside the releases this probe was tested with ({text}); the probe stays "
            "active, but check its findings, and report a problem if you see one",
        )


def _keeping_made_up_answers(original: Callable) -> Callable:
    def postprocess_generated_text(generation: Any, *args: Any, **kwargs: Any) -> Any:
        # lm-eval cuts stop sequences off with str.split, which would turn a made-up answer
        # into a plain "" that both cache layers would then store as the model's answer.
        if isinstance(generation, ShortCircuitAnswer):
            return generation
        return original(generation, *args, **kwargs)

    return mark(postprocess_generated_text, original)


def is_installed(vllm_causallms: Any) -> bool:
    return is_ours(vllm_causallms.VLLM.__dict__.get("_model_generate"))


def install_vllm(vllm_causallms: Any) -> None:
    """Patch lm-eval's ``VLLM`` backend (idempotent); the engine is hooked at its first use.

    Raises LookupError when lm-eval's module lacks what the probe hooks; nothing is
    patched then.
    """
    cls = vllm_causallms.VLLM
    needed = ("generate_until", "_model_generate", "modify_gen_kwargs")
    missing = [name for name in needed if name not in cls.__dict__]
    if missing or not callable(getattr(vllm_causallms, "postprocess_generated_text", None)):
        raise LookupError(f"lm-eval's VLLM class has no {', '.join(missing) or 'postprocess_generated_text'}")
    wrap(cls, "generate_until", _probed_generate_until)
    wrap(cls, "_model_generate", _probed_model_generate)
    raw = cls.__dict__["modify_gen_kwargs"]
    if not is_ours(raw):
        if isinstance(raw, staticmethod):
            replace(cls, "modify_gen_kwargs", staticmethod(_recording_modify_gen_kwargs(raw.__func__)))
        else:
            raise LookupError("lm-eval's VLLM.modify_gen_kwargs is not a static method")
    wrap(vllm_causallms, "postprocess_generated_text", _keeping_made_up_answers)
