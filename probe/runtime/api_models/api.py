"""Glue for lm-eval's API models (``TemplateAPI``): the async and the sync request paths.

``amodel_call`` waits at the outer gate, may stream, and can be cancelled by a trip.
Both paths answer blank once the request's group has tripped.
``generate_until`` sends each group's seeded sample first, on both paths.
Responses are observed through ``parse_generations``, whatever a pipeline replaced it with.
Each budget is read off the payload lm-eval builds; the probe never calls a builder itself.
See docs/api.md.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from collections.abc import Callable
from functools import partial
from types import FunctionType
from typing import Any

from probe.runtime.api_models import budgets
from probe.runtime.api_models.streamed_post import StreamingSession
from probe.runtime.core.answers import BLANK, BlankResponse
from probe.runtime.core.contract import ENV_MIN_MAX_TOKENS
from probe.runtime.core.streaming import wanted
from probe.runtime.hooking.integration import Integration
from probe.runtime.hooking.patching import MARKER, is_ours, mark, replace, restore_where, wrap
from probe.runtime.hooking.versions import LM_EVAL
from probe.runtime.inprocess.order import install_order, sampled_order
from probe.runtime.scope import state
from probe.runtime.scope.gate import Gate
from probe.runtime.scope.groups import PREDICTED, UNREADABLE, Request

# The request a running call belongs to. Kept in a context variable, never on the model
# object: dozens of calls run on the same model at once under num_concurrent > 1.
_CURRENT: contextvars.ContextVar[Request | None] = contextvars.ContextVar("lm_eval_probe_request", default=None)
_SIGNATURES: dict[Any, inspect.Signature] = {}


def _request(probe: state.Probe, lm: Any, original: Callable, args: tuple, kwargs: dict) -> Request | None:
    """The probe's view of a call, or None when the call is none of its business.

    Any signature is accepted (``sem`` appeared in 0.4.9.1): arguments are found by name.
    """
    signature = _SIGNATURES.get(original)
    if signature is None:
        signature = _SIGNATURES[original] = inspect.signature(original)
    bound = signature.bind_partial(lm, *args, **kwargs).arguments
    extra = bound.get("kwargs", {})
    messages = bound.get("messages", extra.get("messages"))
    if not bound.get("generate", kwargs.get("generate", True)):
        # Loglikelihood: emits no tokens, so it is counted, never analysed nor short-circuited.
        probe.count_loglikelihood(len(messages) if isinstance(messages, list) else 1)
        return None
    gen_kwargs = bound.get("gen_kwargs", extra.get("gen_kwargs")) or {}
    if messages is None:
        return None
    # The async path's cache keys hold each prompt as the task gave it (messages may be
    # token ids); the sync path passes the prompts themselves.
    keys = bound.get("cache_keys", extra.get("cache_keys"))
    prompts = [key[0] for key in keys] if isinstance(keys, list) and len(keys) == len(messages) else list(messages)
    # The budget as lm-eval's own builder makes it, until the payload lm-eval sends is built:
    # where the probe sees that built (observe_builder), its budget replaces this one.
    chat = isinstance(messages, list) and bool(messages) and type(messages[0]).__name__ == "JsonChatStr"
    observed = observe_builder(lm)
    if not observed:
        # What it will send cannot be read: its budget is unknown, and nothing is taken to be at
        # the cap (a builder that changes the budget would otherwise be judged by another).
        probe.errors.once(
            f"unread builder:{type(lm).__qualname__}",
            f"the payload builder of {type(lm).__qualname__} is set on the model object or is no plain function, "
            "so the probe cannot read the budget its requests are sent with: the trip rule does not judge them "
            "(they are counted in the evidence)",
        )
    budget = budgets.predicted(lm, gen_kwargs, chat) if observed else None
    # An unread builder may still call a wrapped one: what that returns is not what is sent.
    request = probe.request(
        lm, gen_kwargs, prompts, budget, budget_source=PREDICTED if observed else UNREADABLE, source=messages
    )
    probe.resume(request)
    return request


def _say_if_blind(probe: state.Probe, request: Request, budget: budgets.Budget) -> None:
    """Say once where a request's two budgets leave the rule blind, with the setting that ends it."""
    if (
        isinstance(budget, tuple)
        and not request.is_evidence
        and (request.max_tokens or 0) >= probe.settings.min_max_tokens
    ):
        least = probe.settings.min_max_tokens
        probe.errors.once(
            f"two budgets:{budget}",
            f"chat requests name max_tokens {budget[0]} and max_completion_tokens {budget[1]}, which servers read "
            f"in different orders, and the smaller is below {ENV_MIN_MAX_TOKENS}={least}: the trip rule does not "
            "judge them; give max_tokens and max_completion_tokens the same value in --gen_kwargs to have them judged",
        )


def observe_builder(lm: Any) -> bool:
    """Make sure the payload builder lm-eval calls for ``lm`` tells the probe the budget of the
    payload it builds (``_recording_builder``); False where it cannot: a builder set on the
    instance, none found, or one of a kind it does not wrap (not a plain function).

    Called on every request, as ``observe_parser`` is: a pipeline that replaces the builder
    after the probe wrapped it is wrapped too. The builder is never called by the probe."""
    owner, raw = _builder_in_effect(lm)
    if owner is None or is_ours(raw):  # not is_ours_within: a pipeline's wrapper of ours is read by a new one
        return owner is not None
    if not isinstance(raw, FunctionType):
        return False
    replace(owner, "_create_payload", _recording_builder(raw))
    return True


def _builder_in_effect(lm: Any) -> tuple[type | None, Any]:
    """The class that defines the ``_create_payload`` lm-eval calls for ``lm``, and its raw attribute.

    (None, None) where there is none, or where it is set on the model object: the probe never wraps that.
    """
    if "_create_payload" in getattr(lm, "__dict__", {}):
        return None, None
    return _raw_attribute(type(lm), "_create_payload")


def _recording_builder(original: Callable) -> Callable:
    """``original`` made to tell the probe the budget of each payload it builds for a request of
    the probe's (``_CURRENT``), before it is sent; the payload itself is untouched."""

    def _create_payload(self: Any, *args: Any, **kwargs: Any) -> Any:
        payload = original(self, *args, **kwargs)
        request, probe = _CURRENT.get(), state.active()
        if request is not None and probe is not None:
            try:
                # Read only as the builder lm-eval calls for this model: called by another (a
                # subclass's through super(), a pipeline's patched on after this request was made,
                # one set on the model), what is sent may differ from what this returns, and is
                # unknown until that one, where it is wrapped too, returns. So is the budget of a
                # payload that names none this probe reads: the server's own applies (vLLM's
                # completions: 16 tokens).
                sent = None
                if _builder_in_effect(self)[1] is wrapper and budgets.names_a_budget(payload):
                    sent = budgets.budget_in(payload, chat="messages" in payload)
                probe.budget_sent(request, sent)
                _say_if_blind(probe, request, sent)
            except Exception as error:
                probe.errors.report("payload", error)
        return payload

    wrapper = mark(_create_payload, original)
    return wrapper


def _begin(
    lm: Any, original: Callable, args: tuple, kwargs: dict, where: str
) -> tuple[state.Probe | None, Request | None]:
    """The active probe and this call's request; (probe, None) when it runs unprobed."""
    probe = state.active()
    if probe is None:
        return None, None
    try:
        if not observe_parser(type(lm)):
            probe.errors.once(
                f"unobservable:{type(lm).__qualname__}",
                f"the responses of {type(lm).__qualname__} cannot be observed (its parse_generations is a "
                f"{type(_raw_attribute(type(lm), 'parse_generations')[1]).__name__}, which the probe cannot wrap); "
                "it runs unprobed",
            )
            return probe, None
        return probe, _request(probe, lm, original, args, kwargs)
    except Exception as error:
        probe.errors.report(where, error)
        return probe, None


def _probed_amodel_call(original: Callable) -> Callable:
    async def amodel_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe, request = _begin(self, original, args, kwargs, "amodel_call")
        if probe is None or request is None:
            return await original(self, *args, **kwargs)
        return await _run_async(probe, request, original, self, args, kwargs)

    return mark(amodel_call, original)


async def _run_async(
    probe: state.Probe, request: Request, original: Callable, lm: Any, args: tuple, kwargs: dict
) -> Any:
    group = request.group
    if group.tripped:
        return probe.blanks(request)
    try:
        gate = probe.gates.for_running_loop(lm, request.is_evidence)
    except Exception as error:
        probe.errors.report("gate", error)
        gate = None
    if gate is not None:
        await gate.acquire(request.n_answers)
    answered = False
    try:
        if group.tripped:  # tripped while this request waited at the gate
            return probe.blanks(request)
        # A task copies the current context when it is created: setting the variable around
        # ensure_future gives lm-eval's call (and the parse_generations it makes) this
        # request, and resetting it at once leaves this wrapper's own context untouched.
        args, kwargs = _streaming(probe, request, original, lm, args, kwargs)
        token = _CURRENT.set(request)
        try:
            inner = asyncio.ensure_future(original(lm, *args, **kwargs))
        finally:
            _CURRENT.reset(token)
        group.inflight.add(inner, request)
        try:
            await asyncio.wait({inner})
        except asyncio.CancelledError:
            inner.cancel()
            raise
        finally:
            group.inflight.discard(inner)
        if request.cancelled_by_probe and (inner.cancelled() or inner.exception() is not None):
            return probe.blanks(request, cancelled=True)
        if not inner.cancelled() and inner.exception() is not None:
            probe.failed(request)  # lm-eval may retry it
        answers = inner.result()
        answered = True
        return answers
    finally:
        if gate is not None:
            _release(probe, gate, answered, request)


def _streaming(
    probe: state.Probe, request: Request, original: Callable, lm: Any, args: tuple, kwargs: dict
) -> tuple[tuple, dict]:
    """The call's arguments, with its session replaced by one that streams (``streamed_post``).

    That happens when the knob allows, the detector would read the text, and the verdict is open.
    Otherwise, and on any error, the arguments come back unchanged.
    """
    if not wanted(probe.settings, [request]):
        return args, kwargs
    mode = probe.settings.stream
    try:
        if not probe.worth_streaming(request):
            return args, kwargs
        bound = _SIGNATURES[original].bind(lm, *args, **kwargs)
        session = bound.arguments.get("session")
        if session is None:
            return args, kwargs
        bound.arguments["session"] = StreamingSession(session, probe, request, mode)
        return bound.args[1:], bound.kwargs
    except Exception as error:
        probe.errors.report("stream", error)
        return args, kwargs


def _release(probe: state.Probe, gate: Gate, answered: bool, request: Request) -> None:
    """Give the call's place back and tell the slow start what its answer showed; never raises.
    The place is given back even when where its group stands cannot be read (the gate then
    opens, as for a group that runs unprobed)."""
    group = request.group
    try:
        try:
            stands = (group.tripped, group.trip_failed, probe.settled(group))
        except Exception as error:
            probe.errors.report("gate", error)
            stands = (False, True, False)
        gate.release(answered, request.labels, *stands, request.n_answers)
    except Exception as error:
        probe.errors.report("gate", error)


def _probed_model_call(original: Callable) -> Callable:
    def model_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        probe, request = _begin(self, original, args, kwargs, "model_call")
        if probe is not None and request is not None and request.group.tripped:
            probe.blanks(request)
            return BlankResponse(request.n_answers)
        token = _CURRENT.set(request)  # for the payload builder (observe_builder); reset before parsing
        try:
            outputs = original(self, *args, **kwargs)
        finally:
            _CURRENT.reset(token)
        if probe is not None and request is not None:
            probe.observe(request, outputs)
        return outputs

    return mark(model_call, original)


def _observing_parser(original: Callable, position: int) -> Callable:
    """``original`` made to observe the response it parses (``outputs``, keyword or the
    positional argument at ``position``: 0 for a static parser, 1 after self or cls)."""

    def parse_generations(*args: Any, **kwargs: Any) -> Any:
        outputs = kwargs["outputs"] if "outputs" in kwargs else args[position] if len(args) > position else None
        if isinstance(outputs, BlankResponse):
            return [BLANK] * outputs.n
        answers = original(*args, **kwargs)
        request = _CURRENT.get()
        probe = state.active()
        if request is not None and probe is not None:
            probe.observe(request, outputs)
        return answers

    return mark(parse_generations, original)


class _ObservingCallable:
    """Stands in for a parser that is a plain callable object (no descriptor): called with
    the same arguments, and like it never bound to the instance."""

    def __init__(self, original: Callable) -> None:
        self._call = _observing_parser(original, 0)
        self.__wrapped__ = original

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._call(*args, **kwargs)


setattr(_ObservingCallable, MARKER, True)


def _raw_attribute(cls: type, name: str) -> tuple[type | None, Any]:
    # The raw attribute, from the defining class's __dict__ along the MRO: getattr would
    # unwrap a staticmethod or bind a classmethod, and lose what kind it was.
    for owner in cls.__mro__:
        if name in owner.__dict__:
            return owner, owner.__dict__[name]
    return None, None


def _observing(raw: Any) -> Any:
    """The observing replacement of the same kind as ``raw``, or None for a kind it cannot wrap."""
    if isinstance(raw, staticmethod):
        return staticmethod(_observing_parser(raw.__func__, 0))
    if isinstance(raw, classmethod):
        return classmethod(_observing_parser(raw.__func__, 1))
    if inspect.isfunction(raw):
        return _observing_parser(raw, 1)
    if callable(raw) and not hasattr(type(raw), "__get__"):
        return _ObservingCallable(raw)
    return None


def observe_parser(cls: type) -> bool:
    """Make sure ``cls.parse_generations`` observes responses; False when it cannot.

    Called on every request rather than once, so that a pipeline which replaces the
    parser after the probe installed (a function, a staticmethod, a classmethod or a
    callable object) is observed too.
    """
    owner, raw = _raw_attribute(cls, "parse_generations")
    # is_ours, not is_ours_within: a pipeline's parser made with functools.wraps around ours may
    # never call it. Wrapped again where it does, a response is still filed once (Probe.observe).
    if owner is None or is_ours(raw):
        return owner is not None
    replacement = _observing(raw)
    if replacement is None:
        return False
    replace(owner, "parse_generations", replacement)
    return True


def _registering_generate_until(original: Callable, api_models: Any = None) -> Callable:
    def generate_until(self: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
        probe = state.active()
        if probe is not None:
            try:
                probe.register(requests)
            except Exception as error:
                probe.errors.report("generate_until", error)
        # The sample first on both paths: what the sync path sends first, what reaches the gate
        # first on the async path, and which prompts share a request with batch_size > 1.
        seed = probe.sampling.seed if probe is not None else None
        with sampled_order(seed, api_models, reserve=probe.reserve if probe is not None else 0):
            return original(self, requests, *args, **kwargs)

    return mark(generate_until, original)


_PATCHED = ("generate_until", "amodel_call", "model_call")


def install_api(api_models: Any) -> None:
    """Patch ``TemplateAPI``'s two request paths, and learn each prompt's task (idempotent)."""
    install_order(api_models)
    wrap(api_models.TemplateAPI, "generate_until", partial(_registering_generate_until, api_models=api_models))
    wrap(api_models.TemplateAPI, "amodel_call", _probed_amodel_call)
    wrap(api_models.TemplateAPI, "model_call", _probed_model_call)


def uninstall_api(api_models: Any) -> None:
    """Restore ``TemplateAPI``'s request paths, the module's ``Collator`` and every parser and
    payload builder made to observe."""
    template = api_models.TemplateAPI
    restore_where(
        lambda owner, name: (
            (owner is template and name in _PATCHED)
            or (owner is api_models and name == "Collator")
            or name in ("parse_generations", "_create_payload")
        )
    )


INTEGRATION = Integration(
    waits_for="lm_eval.models.api_models",
    install=install_api,
    uninstall=uninstall_api,
    tested=(LM_EVAL,),
    unprobed="lm-eval's API models",
)
