"""Glue for lm-eval's Hugging Face backend (``--model hf``, ``HFLM``): invasive patches.

The probe hooks ``generate_until``, ``tok_batch_encode`` and lm-eval's stopping criteria.
It runs lm-eval's own batches, a seeded sample of whole batches first, and answers in lm-eval's order.
Its criterion (:class:`Watch`) observes each row the step it ends.
On a trip it ends the batch at once; unfinished rows and later batches get blank answers.
Loglikelihood is never touched. What the probe cannot follow runs unprobed, said once.
See docs/hf.md.
"""

from __future__ import annotations

import contextvars
import inspect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from probe.runtime.core.answers import BLANK
from probe.runtime.hooking.integration import Integration
from probe.runtime.hooking.patching import is_ours_within, mark, restore_where, wrap
from probe.runtime.hooking.versions import LM_EVAL
from probe.runtime.inprocess.model import OfflineModel
from probe.runtime.inprocess.order import install_order, sampled_order
from probe.runtime.scope import state
from probe.runtime.scope.groups import Group, Request, group_key

BACKEND = "hf"
MODEL_GENERATE_PARAMETERS = ["self", "context", "max_length", "stop", "generation_kwargs"]
HOOKED_METHODS = ("generate_until", "tok_batch_encode", "_model_generate")


@dataclass
class Plan:
    """One ``generate_until`` call: each prompt's settings and task, the batch being encoded,
    and which answers of the batch just generated are to be blank."""

    probe: state.Probe  # the scope of the evaluation that called generate_until
    rows: dict[int, tuple[Any, str | None] | None]  # id(prompt) -> (gen_kwargs, task); None: ambiguous
    encoding: list[Any] | None = None  # the prompts of the batch about to be generated
    blank: deque[bool] = field(default_factory=deque)  # one per row, consumed in order


@dataclass
class Watch:
    """The probe's stopping criterion for one batch: it observes each row as it ends.

    When the group trips, it ends the batch at once, and the rows still running are answered blank.
    """

    probe: state.Probe
    requests: list[Request]  # one per row
    start: int  # the prompt's width: generated tokens come after it
    budget: int
    eos: set[int]
    answer: Callable[[list[int]], str]  # the answer lm-eval keeps from a row's generated tokens
    end_reason: str = "length"  # how a row that generate ended without a stop ended
    criteria: list[Any] = field(default_factory=list)  # lm-eval's stop-sequence criteria
    open: list[int] = field(default_factory=list)
    blanked: set[int] = field(default_factory=set)
    last: Any = None  # the sequences at the last step seen
    attached: bool = False
    broken: bool = False

    def __post_init__(self) -> None:
        self.open = list(range(len(self.requests)))

    @property
    def group(self) -> Group:
        return self.requests[0].group

    def attach(self, criteria: Any) -> None:
        """Join lm-eval's criteria for this batch, whose ``done_tracker`` says which rows have
        met a stop sequence; a kind without one leaves the batch unobserved (said once)."""
        found = list(criteria)
        if not all(isinstance(getattr(c, "done_tracker", None), list) for c in found):
            self.broken = True
            self.probe.errors.once(
                "hf criteria",
                "lm-eval's stop-sequence criteria are not as this probe knows them (no done_tracker); "
                "lm-eval's Hugging Face backend runs unprobed",
            )
            return
        self.criteria = found
        criteria.append(self)
        self.attached = True

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> bool:
        if self.broken or not self.open:
            return False
        try:
            return self._step(input_ids)
        except Exception as error:
            self.broken = True  # never stop a batch, nor blank an answer, on a probe error
            self.probe.errors.report("hf stopping criterion", error)
            return False

    def _step(self, input_ids: Any) -> bool:
        if input_ids.shape[0] != len(self.requests):  # beams or several returns: rows unknown
            self.broken = True
            self.probe.errors.once(
                "hf rows",
                f"{input_ids.shape[0]} sequences generated for {len(self.requests)} prompts (beam search or "
                "num_return_sequences); those generations are not observed",
            )
            return False
        self.last = input_ids
        generated = input_ids.shape[1] - self.start
        last = input_ids[:, -1].tolist()
        for i in list(self.open):
            if last[i] in self.eos or any(c.done_tracker[i] for c in self.criteria):
                self._end(i, input_ids, generated, "stop")
            elif generated >= self.budget:
                self._end(i, input_ids, generated, "length")
        if self.open and self.group.tripped:
            for i in self.open:
                self.blanked.add(i)
                self.probe.blanks(self.requests[i], cancelled=True)
            self.open.clear()
            return True
        return False

    def _end(self, i: int, input_ids: Any, generated: int, reason: str) -> None:
        self.open.remove(i)
        text = self.answer(input_ids[i, self.start :].tolist())  # for the evidence's empty answers
        response = {
            "choices": [{"index": 0, "finish_reason": reason, "text": text}],
            "usage": {"completion_tokens": generated},
        }
        self.probe.observe(self.requests[i], response)

    def close(self) -> list[bool]:
        """After ``generate``: one flag per row, True for a row to answer blank. A row still
        open was ended by a limit of ``generate``'s own (``max_time``, or a budget the probe
        did not know): it did not stop, and is observed as ``end_reason``."""
        if not self.attached and not self.broken:
            self.probe.errors.once(
                "hf unobserved",
                "the probe's stopping criterion never joined a batch; lm-eval's Hugging Face backend runs unprobed",
            )
        if self.attached and not self.broken and self.last is not None:
            for i in list(self.open):
                self._end(i, self.last, self.last.shape[1] - self.start, self.end_reason)
        return [i in self.blanked for i in range(len(self.requests))]


# The generate_until call running now, and the batch being generated; any other use of the
# model (loglikelihood, another thread) finds them unset and is left alone.
_PLAN: contextvars.ContextVar[Plan | None] = contextvars.ContextVar("lm_eval_probe_hf_plan", default=None)
_WATCH: contextvars.ContextVar[Watch | None] = contextvars.ContextVar("lm_eval_probe_hf_watch", default=None)


def _probed_generate_until(original: Callable, huggingface: Any = None) -> Callable:
    def generate_until(self: Any, requests: Any, *args: Any, **kwargs: Any) -> Any:
        plan = None
        probe = state.active()
        if probe is not None:
            try:
                plan = _plan(probe, self, requests)
            except Exception as error:
                probe.errors.report("hf generate_until", error)
        token = _PLAN.set(plan)
        try:
            # A seeded sample of whole batches first: every batch is lm-eval's, so no row's
            # padding (nor, in bfloat16, its answer) changes.
            seed = plan.probe.sampling.seed if plan else None
            reserve = plan.probe.reserve if plan else 0
            with sampled_order(seed, huggingface, reserve=reserve, whole_batches=True):
                return original(self, requests, *args, **kwargs)
        finally:
            _PLAN.reset(token)

    return mark(generate_until, original)


def _plan(probe: state.Probe, lm: Any, requests: Any) -> Plan | None:
    cls = type(lm)
    replaced = [name for name in HOOKED_METHODS if not is_ours_within(getattr(cls, name, None))]
    if replaced:
        probe.errors.once(
            f"hf subclass:{cls.__qualname__}",
            f"{cls.__qualname__} replaces HFLM's {', '.join(replaced)}; its generations run unprobed",
        )
        return None
    if getattr(lm, "backend", "causal") != "causal":
        probe.errors.once("hf seq2seq", "encoder-decoder models on lm-eval's Hugging Face backend run unprobed")
        return None
    probe.register(requests)
    rows: dict[int, tuple[Any, str | None] | None] = {}
    for instance in requests:
        # A batch names its prompts only, so one prompt object (an interned string) sent with
        # two settings or by two tasks cannot be told apart: its batches run unprobed.
        row = (instance.args[1], getattr(instance, "task_name", None))
        key = id(instance.args[0])
        rows[key] = row if rows.get(key, row) == row else None
    return Plan(probe, rows)


def _recording_tok_batch_encode(original: Callable) -> Callable:
    def tok_batch_encode(self: Any, strings: Any, *args: Any, **kwargs: Any) -> Any:
        plan = _PLAN.get()
        if plan is not None:
            plan.encoding = list(strings)
        return original(self, strings, *args, **kwargs)

    return mark(tok_batch_encode, original)


def _probed_model_generate(original: Callable) -> Callable:
    def _model_generate(self: Any, context: Any, max_length: int, stop: list[str], **generation_kwargs: Any) -> Any:
        plan = _PLAN.get()
        probe = plan.probe if plan is not None else None
        watch = _watch(probe, plan, self, context, max_length, stop, generation_kwargs) if plan and probe else None
        if plan is None or probe is None or watch is None:
            return original(self, context, max_length, stop, **generation_kwargs)
        if watch.group.tripped:  # in an earlier batch: never generated, every answer blank
            for request in watch.requests:
                probe.blanks(request)
            plan.blank.extend([True] * len(watch.requests))
            return context[:, :0]  # no token after the prompt: lm-eval decodes an empty answer
        token = _WATCH.set(watch)
        try:
            generated = original(self, context, max_length, stop, **generation_kwargs)
        finally:
            _WATCH.reset(token)
        flags = watch.close()
        if any(flags):
            plan.blank.extend(flags)
        return generated

    return mark(_model_generate, original)


def _watch(
    probe: state.Probe, plan: Plan, lm: Any, context: Any, max_length: int, stop: list[str], kwargs: dict
) -> Watch | None:
    """The criterion for this batch, its rows registered; None when it runs unprobed."""
    try:
        prompts, plan.encoding = plan.encoding, None
        if plan.blank:  # lm-eval did not cut every answer of the last batch: blanks went astray
            plan.blank.clear()
            probe.errors.once("hf answers", "lm-eval did not post-process every answer of a batch; not probed")
            return None
        found = [plan.rows.get(id(prompt)) for prompt in prompts or ()]
        rows = [row for row in found if row is not None]
        if not rows or len(found) != context.shape[0] or len(rows) != len(found):
            probe.errors.once(
                "hf prompts",
                f"cannot tell the prompts of a batch of {context.shape[0]}; lm-eval's Hugging Face backend "
                "runs unprobed",
            )
            return None
        if len({group_key(gen_kwargs)[0] for gen_kwargs, _ in rows}) != 1:
            probe.errors.once("hf groups", "a batch mixes generation settings; it runs unprobed")
            return None
        start = context.shape[1]
        budget = _budget(lm, kwargs, max_length, start)
        model = OfflineModel(_model_name(lm))
        requests = [
            probe.request(model, gen_kwargs, [prompt], budget, backend=BACKEND, tasks=[task])
            for prompt, (gen_kwargs, task) in zip(prompts, rows, strict=True)
        ]
        answer = partial(_kept_answer, lm, list(stop or ()))
        end = "timeout" if kwargs.get("max_time") is not None else "length"
        return Watch(probe, requests, start, budget, _eos_ids(lm, kwargs), answer, end)
    except Exception as error:
        probe.errors.report("hf _model_generate", error)
        return None


def _budget(lm: Any, kwargs: dict, max_length: int, start: int) -> int:
    """The new tokens ``generate`` allows each row.

    ``max_new_tokens`` takes precedence over ``max_length``; the keyword's first, then the generation config's.
    A model may ship a generation config, which then overrides lm-eval's ``max_gen_toks``.
    """
    config = getattr(getattr(lm, "model", None), "generation_config", None)
    for value in (kwargs.get("max_new_tokens"), getattr(config, "max_new_tokens", None)):
        if isinstance(value, int) and value > 0:
            return value
    return max_length - start


def _kept_answer(lm: Any, stops: list[str], tokens: list[int]) -> str:
    """The answer lm-eval keeps from a row's generated ``tokens``: after its end-of-thinking
    token when it has one (HFLM's ``think_end_token``), cut at the stop sequences."""
    think = getattr(lm, "think_end_token", None)
    if isinstance(think, int) and think in tokens:
        tokens = tokens[len(tokens) - tokens[::-1].index(think) :]
    text = lm.tok_decode(tokens)
    if isinstance(think, int):
        text = text.lstrip()
    for stop in stops:
        if stop:
            text = text.split(stop)[0]
    if isinstance(think, str) and think:
        text = text.split(think)[-1].lstrip()
    return text


def _model_name(lm: Any) -> str | None:
    pretrained = getattr(lm, "pretrained", None)
    if isinstance(pretrained, str):
        return pretrained
    name = getattr(getattr(lm, "model", None), "name_or_path", None)
    return name if isinstance(name, str) else None


def _eos_ids(lm: Any, kwargs: dict) -> set[int]:
    """Every token id that ends a row in ``generate``: the generation config's EOS, the
    keyword's, and lm-eval's end-of-text token."""
    found: set[int] = set()
    config = getattr(getattr(lm, "model", None), "generation_config", None)
    for value in (getattr(config, "eos_token_id", None), kwargs.get("eos_token_id"), getattr(lm, "eot_token_id", None)):
        for token in value if isinstance(value, list | tuple) else [value]:
            if isinstance(token, int):
                found.add(token)
    return found


def _joining_criteria(original: Callable) -> Callable:
    def stop_sequences_criteria(*args: Any, **kwargs: Any) -> Any:
        criteria = original(*args, **kwargs)
        watch = _WATCH.get()
        if watch is not None and not watch.attached and not watch.broken:
            try:
                watch.attach(criteria)
            except Exception as error:
                watch.broken = True
                watch.probe.errors.report("hf stop_sequences_criteria", error)
        return criteria

    return mark(stop_sequences_criteria, original)


def _blanking_postprocess(original: Callable) -> Callable:
    def postprocess_generated_text(*args: Any, **kwargs: Any) -> Any:
        plan = _PLAN.get()
        if plan is not None and plan.blank and plan.blank.popleft():
            return BLANK  # a blank answer, of the type both cache layers refuse
        return original(*args, **kwargs)

    return mark(postprocess_generated_text, original)


def install_hf(huggingface: Any) -> None:
    """Patch lm-eval's ``HFLM`` (idempotent).

    Raises LookupError, having patched nothing, when lm-eval's module lacks what is hooked.
    """
    cls = huggingface.HFLM
    generate = cls.__dict__.get("_model_generate")
    until = inspect.unwrap(cls.__dict__.get("generate_until"))  # lm-eval's own, under any wrapper of it
    if not (
        inspect.isfunction(generate)
        and list(inspect.signature(generate).parameters) == MODEL_GENERATE_PARAMETERS
        and inspect.isfunction(until)
        and inspect.isfunction(cls.__dict__.get("tok_batch_encode"))
        # the answers are cut, one call per row, by the module's own postprocess_generated_text
        and "postprocess_generated_text" in until.__code__.co_names
        and callable(getattr(huggingface, "postprocess_generated_text", None))
        and callable(getattr(huggingface, "stop_sequences_criteria", None))
    ):
        raise LookupError(f"lm-eval's HFLM class is not as this probe knows it (tested with {LM_EVAL.releases()})")
    install_order(huggingface)
    for name, make in (
        ("generate_until", partial(_probed_generate_until, huggingface=huggingface)),
        ("tok_batch_encode", _recording_tok_batch_encode),
        ("_model_generate", _probed_model_generate),
    ):
        wrap(cls, name, make)
    wrap(huggingface, "stop_sequences_criteria", _joining_criteria)
    wrap(huggingface, "postprocess_generated_text", _blanking_postprocess)


def uninstall_hf(huggingface: Any) -> None:
    """Restore ``HFLM``'s methods and the module's functions."""
    cls = huggingface.HFLM
    restore_where(lambda owner, name: owner is cls or owner is huggingface)


INTEGRATION = Integration(
    waits_for="lm_eval.models.huggingface",
    install=install_hf,
    uninstall=uninstall_hf,
    tested=(LM_EVAL,),
    unprobed="lm-eval's Hugging Face backend",
)
