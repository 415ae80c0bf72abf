"""Evidence filed where it belongs: per request (not per prompt text), under the cause the
server's answer shows, with every text naming that cause. Real lm-eval model classes against
the simulated server, the probe installed in-process."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from lm_eval.api.instance import Instance
from lm_eval.models.api_models import JsonChatStr
from support.lm import GEN_KWARGS, chat, completions, probe_installed, prompts

from probe.demo.localtask import offline_env
from probe.demo.simserver import SimServer
from probe.runtime.api_models.budgets import predicted
from probe.runtime.core import contract, evidence
from probe.runtime.core.contract import CAUSES, RULE_CAUSES, cause_words, main_cause
from probe.summary import summary


def _instances(texts: list[str], task: str, start: int = 0) -> list[Instance]:
    return [
        Instance("generate_until", doc={}, arguments=(text, dict(GEN_KWARGS)), idx=start + i, metadata=(task, i, 1))
        for i, text in enumerate(texts)
    ]


@pytest.mark.parametrize("concurrency", [1, 8], ids=["sync", "async"])
def test_two_tasks_that_share_their_prompts_each_get_their_own_requests(sim, probed, concurrency) -> None:
    """gsm8k and gsm8k_platinum share questions: each task's 30 requests are its own."""
    server = sim("healthy")
    shared = prompts(30)
    lm = completions(server.base_url, num_concurrent=concurrency)
    answers = lm.generate_until(_instances(shared, "gsm8k") + _instances(shared, "gsm8k_platinum", 30))
    assert len(answers) == 60 and server.snapshot()["generate_requests"] == 60
    tasks = probed.evidence_document()["tasks"]
    assert {name: (found["generate_requests"], found["observations"]) for name, found in tasks.items()} == {
        "gsm8k": (30, 30), "gsm8k_platinum": (30, 30),
    }  # fmt: skip


def test_shared_prompts_are_handed_out_per_request_whatever_the_counts() -> None:
    """The book's property: each task gets as many of a shared prompt's requests as it
    registered, in any interleaving of registrations."""
    from probe.runtime.scope.tasks import TaskBook

    book = TaskBook()
    book.register([("q", "g", "a")] * 3 + [("q", "g", "b")] * 2 + [("other", "g", "a")])
    taken = [book.take("q", "g") for _ in range(5)]
    assert sorted(taken, key=str) == ["a", "a", "a", "b", "b"]
    assert book.take("other", "g") == "a"


def test_a_context_window_trip_names_the_window_everywhere(sim, probed, result_dir, capsys, monkeypatch) -> None:
    """vLLM's max_model_len: every generation ends with `length` at 1024 of 2048 tokens."""
    monkeypatch.setenv(contract.ENV_REPORT, str(result_dir.parent / "observed.json"))  # as eval-probe run sets it
    server = sim("window")
    completions(server.base_url, num_concurrent=16).generate_until(_instances(prompts(40), "t"))
    probed.finalise()
    trip = json.loads((result_dir / contract.SIDECAR_NAME).read_text())["verdict"]
    assert trip["cause"] == contract.CONTEXT_WINDOW and trip["causes"][contract.CONTEXT_WINDOW] == 16
    assert trip["pathology"] == contract.PATHOLOGY  # the schema's value, for every cause
    assert probed.evidence_document()["tasks"]["t"]["causes"][contract.CONTEXT_WINDOW] >= 16
    what, advice = cause_words(contract.CONTEXT_WINDOW)
    line = capsys.readouterr().err
    said = summary(result_dir, result_dir.parent / "observed.json")
    read = subprocess.run([sys.executable, "-m", "probe", "read", str(result_dir)], capture_output=True, text=True,
                          timeout=60).stdout  # fmt: skip
    for text in (line, said, read):
        assert what in text and advice in text
        assert "max_tokens cap" not in text and "does not stop" not in text


# "No limit" spelled as a budget: 2**63 - 1 fits the payload, and a server clamps it to its window.
NO_LIMIT = 2**63 - 1


class _Clamping(SimServer):
    """vLLM's clamp (min(max_tokens, max_model_len - prompt)): a never-stopping model's every
    generation ends ``length`` at the window's 256 tokens, far below the budget asked for."""

    def _plan(self, prompt: str, max_tokens: int, turned: bool = False) -> tuple[str, int, str]:
        return super()._plan(prompt, min(max_tokens, 256), turned)


class _NoFinishReason(SimServer):
    """A server that reports no finish_reason: only usage.completion_tokens tells."""

    def _choice(self, index: int, reason: str, text: str, chat: bool, tokens: int) -> dict:
        return {**super()._choice(index, reason, text, chat, tokens), "finish_reason": None}


def test_a_budget_too_large_to_record_still_judges_its_generations(probed, result_dir, monkeypatch) -> None:
    """max_tokens=2**63-1 behind a clamping server: a `length` at 256 tokens is the window's,
    and the run trips for it; the budget, more digits than a count may have, is not written."""
    monkeypatch.setenv(contract.ENV_REPORT, str(result_dir.parent / "observed.json"))  # as eval-probe run sets it
    with _Clamping("never_stop") as server:
        kwargs = {**GEN_KWARGS, "max_tokens": NO_LIMIT}
        lm = completions(server.base_url, num_concurrent=4)
        answers = lm.generate_until(
            [Instance("generate_until", doc={}, arguments=(p, dict(kwargs)), idx=i, metadata=("t", i, 1))
             for i, p in enumerate(prompts(40))]
        )  # fmt: skip
    probed.finalise()
    assert answers.count("") >= 40 - 16 - 4  # tripped after 16, the in-flight ones at most
    trip = json.loads((result_dir / contract.SIDECAR_NAME).read_text())["verdict"]
    assert (trip["cause"], trip["max_tokens"]) == (contract.CONTEXT_WINDOW, [])
    found = probed.evidence_document()["tasks"]["t"]
    assert found["causes"][contract.CONTEXT_WINDOW] == found["observations"] >= 16 and found["max_tokens"] == []
    read = subprocess.run([sys.executable, "-m", "probe", "read", str(result_dir)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert read.returncode == 1, read.stdout + read.stderr  # below the floor, cut short: the sidecar held
    assert cause_words(contract.CONTEXT_WINDOW)[0] in read.stdout and "max_tokens not recorded" in read.stdout
    assert "(max_tokens not recorded)" in summary(result_dir, result_dir.parent / "observed.json")


def test_a_budget_too_large_to_record_never_makes_a_healthy_answer_cut_off(probed) -> None:
    """Without a finish_reason, usage.completion_tokens is compared with the budget as asked
    for: a healthy model's answers under max_tokens=2**63-1 are below it, never at the cap."""
    kwargs = {**GEN_KWARGS, "max_tokens": NO_LIMIT}
    with _NoFinishReason("healthy") as server:
        answers = completions(server.base_url, num_concurrent=4).generate_until(
            [Instance("generate_until", doc={}, arguments=(p, dict(kwargs)), idx=i, metadata=("t", i, 1))
             for i, p in enumerate(prompts(24))]
        )  # fmt: skip
    assert "" not in answers
    found = probed.evidence_document()["tasks"]["t"]
    assert (found["generate_requests"], found["observations"], found["cut_off"]) == (24, 24, 0)
    assert found["finish_reasons"] == {evidence.USAGE_BELOW_CAP: 24} and not found["tripped"]


class _MaxTokensFirst(SimServer):
    """A chat server that reads max_tokens before max_completion_tokens, as some SGLang releases
    do (vLLM and OpenAI, and the simulated server, read max_completion_tokens first)."""

    async def _completions(self, request: Any) -> Any:
        payload = await request.json()
        if payload.get("max_tokens") is not None:
            payload.pop("max_completion_tokens", None)
        request._read_bytes = json.dumps(payload).encode()
        return await super()._completions(request)


def _chats(kwargs: dict, n: int) -> list[Instance]:
    """``n`` chat requests of task "t" under the generation settings ``kwargs``."""
    chats = [JsonChatStr(json.dumps([{"role": "user", "content": p}])) for p in prompts(n)]
    return [Instance("generate_until", doc={}, arguments=(c, dict(kwargs)), idx=i, metadata=("t", i, 1))
            for i, c in enumerate(chats)]  # fmt: skip


def _run_chat(server: SimServer, kwargs: dict, n: int = 40) -> list[str]:
    return chat(server.base_url, num_concurrent=4).generate_until(_chats(kwargs, n))


@pytest.mark.parametrize(
    ("server_class", "budgets"), [(SimServer, (1024, 16384)), (_MaxTokensFirst, (16384, 2048))],
    ids=["vllm-order", "sglang-order"],
)  # fmt: skip
def test_a_chat_request_that_names_two_budgets_never_makes_a_healthy_answer_cut_off(
    probed, server_class, budgets
) -> None:
    """lm-eval passes a max_completion_tokens setting on beside max_tokens, and chat servers read
    the two in different orders: a healthy thinking model's 3,000-token stops, under the budget
    the server takes (16384), are not at the cap because the other reading is smaller."""
    max_tokens, completion = budgets
    kwargs = {**GEN_KWARGS, "max_tokens": max_tokens, "max_completion_tokens": completion}
    with server_class("healthy", lengths="reasoning") as server:
        answers = _run_chat(server, kwargs, 24)
        assert server.snapshot()["generate_requests"] == 24
    assert "" not in answers
    found = probed.evidence_document()["tasks"]["t"]
    assert (found["observations"], found["stop_at_cap"], found["tripped"]) == (24, 0, False)
    assert found["max_tokens"] == sorted(budgets)  # both written: which one the server took is not known


@pytest.mark.parametrize("server_class", [SimServer, _MaxTokensFirst], ids=["vllm-order", "sglang-order"])
def test_a_never_stopping_model_trips_under_whichever_of_two_budgets_the_server_takes(
    probed, result_dir, server_class
) -> None:
    """Both budgets count for the rule (at least MIN_MAX_TOKENS): generations cut at either are cut
    at the output cap, and the run trips as under one."""
    kwargs = {**GEN_KWARGS, "max_tokens": 4096, "max_completion_tokens": 2048}
    with server_class("never_stop") as server:
        answers = _run_chat(server, kwargs)
    assert answers.count("") >= 40 - 16 - 4
    trip = json.loads((result_dir / contract.SIDECAR_NAME).read_text())["verdict"]
    assert (trip["cause"], trip["max_tokens"]) == (contract.OUTPUT_CAP, [2048, 4096])


@pytest.mark.parametrize(
    ("endpoint", "completion"), [("chat", None), ("completions", 512)], ids=["chat-null", "completions"]
)
def test_a_max_completion_tokens_no_server_reads_leaves_max_tokens_the_budget(
    sim, probed, result_dir, endpoint, completion
) -> None:
    """A null max_completion_tokens (vLLM then takes max_tokens), or one sent to a completions
    endpoint (which knows only max_tokens): the run is judged by max_tokens, and trips."""
    server = sim("never_stop")
    kwargs = {**GEN_KWARGS, "max_tokens": 2048, "max_completion_tokens": completion}
    if endpoint == "chat":
        answers = _run_chat(server, kwargs)
    else:
        answers = completions(server.base_url, num_concurrent=4).generate_until(_instances(prompts(40), "t"))
    assert answers.count("") >= 40 - 16 - 4
    trip = json.loads((result_dir / contract.SIDECAR_NAME).read_text())["verdict"]
    assert (trip["cause"], trip["max_tokens"]) == (contract.OUTPUT_CAP, [2048])


@pytest.mark.parametrize("server_class", [SimServer, _MaxTokensFirst], ids=["vllm-order", "sglang-order"])
def test_a_null_max_tokens_leaves_max_completion_tokens_the_budget(probed, result_dir, server_class) -> None:
    """max_tokens=None beside max_completion_tokens: lm-eval sends the null, and a server of either
    order then takes max_completion_tokens: the run is judged by it, and trips."""
    kwargs = {**GEN_KWARGS, "max_tokens": None, "max_completion_tokens": 2048}
    with server_class("never_stop") as server:
        answers = _run_chat(server, kwargs)
    assert answers.count("") >= 40 - 16 - 4
    trip = json.loads((result_dir / contract.SIDECAR_NAME).read_text())["verdict"]
    assert (trip["cause"], trip["max_tokens"]) == (contract.OUTPUT_CAP, [2048])


def test_two_budgets_the_rule_cannot_judge_are_said_once_with_the_setting_that_ends_it(sim, probed, capsys) -> None:
    """max_completion_tokens=4096 alone: lm-eval still sends its default max_tokens (256), which
    some servers take; the rule judges neither, and says so once, naming what to set."""
    server = sim("never_stop")
    kwargs = {key: value for key, value in GEN_KWARGS.items() if key != "max_tokens"}
    answers = _run_chat(server, {**kwargs, "max_completion_tokens": 4096}, 24)
    assert "" not in answers  # not judged: nothing blanked
    found = probed.evidence_document()["tasks"]["t"]
    assert (found["observations"], found["below_min_max_tokens"], found["tripped"]) == (24, 24, False)
    err = capsys.readouterr().err  # lm-eval's progress bar may share the line
    said = [line[line.index("[lm-eval-probe]") :] for line in err.splitlines() if "max_completion_tokens 4096" in line]
    assert said == [
        "[lm-eval-probe] chat requests name max_tokens 256 and max_completion_tokens 4096, which servers read in "
        "different orders, and the smaller is below HYPERLOOM_EVAL_PROBE_MIN_MAX_TOKENS=1024: the trip rule does "
        "not judge them; give max_tokens and max_completion_tokens the same value in --gen_kwargs to have them judged"
    ]


def _lm_eval_model(name: str, base_url: str = "http://127.0.0.1:9", num_concurrent: int = 4) -> Any:
    from lm_eval.models.openai_completions import OpenAIChatCompletion

    if name == "openai-chat":  # lm-eval's OpenAI chat model: sends max_completion_tokens, never max_tokens
        return chat(base_url, num_concurrent, OpenAIChatCompletion)
    return chat(base_url, num_concurrent) if name == "local-chat" else completions(base_url, num_concurrent)


@pytest.mark.parametrize(
    ("model", "settings", "budget"),
    [
        ("openai-chat", {"max_completion_tokens": 4096}, 4096),  # lm-eval's default max_tokens is not sent
        ("openai-chat", {"max_tokens": 8192, "max_completion_tokens": 2048}, 2048),  # the setting wins
        ("openai-chat", {"max_tokens": 2048, "max_completion_tokens": None}, None),  # null: no budget at all
        ("openai-chat", {"max_tokens": 2048}, 2048),
        ("local-chat", {"max_completion_tokens": 4096}, (256, 4096)),  # beside lm-eval's default max_tokens
        ("local-chat", {"max_tokens": None, "max_completion_tokens": 2048}, 2048),
        ("local-chat", {"max_tokens": 2048, "max_completion_tokens": None}, 2048),
        ("local-chat", {"max_tokens": 2048, "max_completion_tokens": 0}, 2048),  # vLLM: 0 or 2048
        ("local-chat", {"max_tokens": 0, "max_completion_tokens": 2048}, 2048),
        ("local-chat", {"max_tokens": 0.0, "max_completion_tokens": 4096}, 4096),  # --gen_kwargs max_tokens=0.0
        ("local-chat", {"max_tokens": False, "max_completion_tokens": 4096}, 4096),
        ("local-chat", {"max_tokens": None, "max_completion_tokens": None}, None),
        ("local-chat", {"max_tokens": "4096", "max_completion_tokens": 2048}, (4096, 2048)),
        ("local-completions", {"max_tokens": 2048, "max_completion_tokens": 512}, 2048),
        ("local-completions", {"max_gen_toks": 1500}, 1500),
    ],
)  # fmt: skip
def test_the_budget_is_read_off_the_payload_lm_eval_sends(monkeypatch, model, settings, budget) -> None:
    """What the server is sent decides: a model that sends one budget is judged by that one, a null
    or zero reading is none (servers take the other), and a null alone leaves none known."""
    monkeypatch.setenv("OPENAI_API_KEY", "not used")
    lm = _lm_eval_model(model)
    assert predicted(lm, {"until": ["\n\n"], "temperature": 0, **settings}, "chat" in model) == budget


def test_a_model_whose_payload_cannot_be_built_is_read_as_lm_eval_computes_it() -> None:
    """A pipeline's own API model without lm-eval's payload builder: max_tokens, else max_gen_toks,
    else the model's default, beside a chat request's max_completion_tokens."""

    class Model:
        _max_gen_toks = 300

    assert predicted(Model(), {"max_gen_toks": 1500}, chat=False) == 1500
    assert predicted(Model(), {"max_completion_tokens": 2048}, chat=False) == 300
    assert predicted(Model(), {"max_completion_tokens": 2048}, chat=True) == (300, 2048)


def _counted_builder(how: str) -> tuple[type, Callable[[], int], Callable[[Any], None]]:
    """lm-eval's local chat model with a pipeline's payload builder that counts its calls,
    installed ``how``: on a subclass, as a patch of lm-eval's class made with functools.wraps
    (which gives it lm-eval's module and name), or on the instance. Returns the model class, the
    count, and what installs it on an instance; the patch of lm-eval's class is undone by the
    caller (monkeypatch)."""
    from lm_eval.models.openai_completions import LocalChatCompletion

    calls = [0]
    original = LocalChatCompletion._create_payload

    @functools.wraps(original)
    def counted(self: Any, *args: Any, **kwargs: Any) -> dict:
        calls[0] += 1
        return original(self, *args, **kwargs)

    model: type = LocalChatCompletion
    if how == "subclass":
        model = type("Counted", (LocalChatCompletion,), {"_create_payload": counted, "__module__": __name__})
    elif how == "patched class":
        LocalChatCompletion._create_payload = counted
    on_instance = (lambda lm: setattr(lm, "_create_payload", partial(counted, lm))) if how == "instance" else None
    return model, lambda: calls[0], on_instance or (lambda lm: None)


@pytest.mark.parametrize("how", ["subclass", "patched class", "instance"])
@pytest.mark.parametrize("concurrency", [1, 4], ids=["sync", "async"])
def test_a_pipelines_own_payload_builder_runs_only_when_lm_eval_calls_it(
    sim, probed, monkeypatch, concurrency, how
) -> None:
    """The probe reads the budget off lm-eval's own builder only: a pipeline's may count, log or
    change the prompts it is given, so it is never run a second time, however it is installed
    (the budget is then what lm-eval's own builder makes of the settings)."""
    from lm_eval.models.openai_completions import LocalChatCompletion

    monkeypatch.setattr(LocalChatCompletion, "_create_payload", LocalChatCompletion._create_payload)
    model, calls, install = _counted_builder(how)
    server = sim("healthy")
    lm = chat(server.base_url, concurrency, model)
    install(lm)
    answers = lm.generate_until(_chats(GEN_KWARGS, 8))
    assert "" not in answers and calls() == server.snapshot()["generate_requests"] == 8
    # Read off what it built; set on the model object, where the probe does not wrap it, unknown.
    read = [] if how == "instance" else [GEN_KWARGS["max_tokens"]]
    assert probed.evidence_document()["tasks"]["t"]["max_tokens"] == read


@pytest.mark.parametrize("concurrency", [1, 4], ids=["sync", "async"])
def test_the_budget_judged_is_the_one_a_pipelines_own_builder_sends(
    sim, probed, result_dir, monkeypatch, concurrency
) -> None:
    """A pipeline's builder that lowers the budget below MIN_MAX_TOKENS (a plain function patched
    onto lm-eval's class): the requests are sent with 512, so none is judged and nothing trips,
    however the settings read (lm-eval's own builder would send 4096)."""
    from lm_eval.models.openai_completions import LocalChatCompletion

    original = LocalChatCompletion._create_payload

    def clamped(self: Any, *args: Any, **kwargs: Any) -> dict:
        payload = original(self, *args, **kwargs)
        if "max_tokens" in payload:
            payload["max_tokens"] = min(payload["max_tokens"], 512)
        return payload

    monkeypatch.setattr(LocalChatCompletion, "_create_payload", clamped)
    server = sim("never_stop")
    answers = chat(server.base_url, concurrency).generate_until(_chats({**GEN_KWARGS, "max_tokens": 4096}, 24))
    assert "" not in answers and server.snapshot()["generate_requests"] == 24
    assert not (result_dir / contract.SIDECAR_NAME).exists()
    found = probed.evidence_document()["tasks"]["t"]
    assert (found["max_tokens"], found["below_min_max_tokens"], found["tripped"]) == ([512], 24, False)


def test_the_builder_made_to_tell_the_budget_is_lm_evals_own_again_once_the_probe_is_out(sim, result_dir) -> None:
    """The probe wraps the payload builder lm-eval calls (on the class that defines it) as the first
    request is made; taking the probe out restores lm-eval's own function."""
    from lm_eval.models.openai_completions import LocalChatCompletion

    from probe.runtime.hooking.patching import is_ours

    own = LocalChatCompletion.__dict__["_create_payload"]
    server = sim("healthy")
    with probe_installed():
        chat(server.base_url, 1).generate_until(_chats(GEN_KWARGS, 1))
        assert is_ours(LocalChatCompletion.__dict__["_create_payload"])
    assert LocalChatCompletion.__dict__["_create_payload"] is own


@pytest.mark.parametrize("concurrency", [1, 4], ids=["sync", "async"])
@pytest.mark.parametrize("how", ["instance", "staticmethod", "payload without a budget"])
def test_a_budget_the_probe_cannot_read_is_unknown_and_never_judged(
    sim, probed, result_dir, capsys, monkeypatch, concurrency, how
) -> None:
    """A pipeline builder the probe does not wrap (set on the model object, a staticmethod), or a
    payload that names no budget it reads (the server then applies its own default): the budget
    sent is not known, so nothing is judged, whatever lm-eval's own builder would have sent."""
    from lm_eval.models.openai_completions import LocalChatCompletion

    original = LocalChatCompletion._create_payload

    def clamped(self: Any, *args: Any, **kwargs: Any) -> dict:
        payload = original(self, *args, **kwargs)
        if how == "payload without a budget":
            payload.pop("max_tokens")
        else:
            payload["max_tokens"] = 512
        return payload

    server = sim("never_stop", default_max_tokens=16)
    lm = chat(server.base_url, concurrency)
    if how == "instance":
        lm._create_payload = partial(clamped, lm)
    elif how == "staticmethod":
        monkeypatch.setattr(LocalChatCompletion, "_create_payload", staticmethod(lambda *a, **k: clamped(lm, *a, **k)))
    else:
        monkeypatch.setattr(LocalChatCompletion, "_create_payload", clamped)
    answers = lm.generate_until(_chats({**GEN_KWARGS, "max_tokens": 4096}, 24))
    assert "" not in answers and not (result_dir / contract.SIDECAR_NAME).exists()
    found = probed.evidence_document()["tasks"]["t"]
    assert (found["max_tokens"], found["unknown_budget"], found["below_min_max_tokens"]) == ([], 24, 0)
    assert not found["tripped"]
    said = capsys.readouterr().err.count("so the probe cannot read the budget its requests are sent with")
    assert said == (0 if how == "payload without a budget" else 1)


def test_a_pipeline_wrapping_the_probes_builder_with_functools_wraps_is_read_and_kept(
    sim, probed, result_dir, monkeypatch
) -> None:
    """A pipeline that patches the builder after the first request, with functools.wraps around
    the probe's own wrapper (which copies its marker): its function is the pipeline's, wrapped in
    turn and read (the budget it lowers is the one judged), and taking the probe out keeps it."""
    from lm_eval.models.openai_completions import LocalChatCompletion

    from probe.runtime import install
    from probe.runtime.hooking.patching import is_ours

    monkeypatch.setattr(LocalChatCompletion, "_create_payload", LocalChatCompletion._create_payload)
    server = sim("never_stop")
    lm = chat(server.base_url, 4)
    lm.generate_until(_chats({**GEN_KWARGS, "max_tokens": 4096}, 1))
    ours = LocalChatCompletion.__dict__["_create_payload"]
    assert is_ours(ours)

    @functools.wraps(ours)
    def clamped(self: Any, *args: Any, **kwargs: Any) -> dict:
        return {**ours(self, *args, **kwargs), "max_tokens": 512}

    assert not is_ours(clamped)
    LocalChatCompletion._create_payload = clamped
    answers = lm.generate_until(_chats({**GEN_KWARGS, "max_tokens": 4096}, 24))
    assert "" not in answers and not (result_dir / contract.SIDECAR_NAME).exists()
    found = probed.evidence_document()["tasks"]["t"]
    assert (found["max_tokens"], found["below_min_max_tokens"]) == ([512, 4096], 24)
    install.uninstall()
    assert LocalChatCompletion.__dict__["_create_payload"] is clamped


def test_a_subclass_builder_through_super_is_read_once_on_what_it_sends(sim, probed, capsys) -> None:
    """A pipeline's builder that calls lm-eval's (already wrapped by an earlier request) through
    super() and then sets max_tokens: read on what the outer one returns, with no two-budget
    warning from the payload in between."""
    from lm_eval.models.openai_completions import LocalChatCompletion

    class Same(LocalChatCompletion):
        def _create_payload(self, *args: Any, **kwargs: Any) -> dict:
            payload = super()._create_payload(*args, **kwargs)
            payload["max_tokens"] = payload["max_completion_tokens"]
            return payload

    server = sim("healthy")
    chat(server.base_url, 4).generate_until(_chats(GEN_KWARGS, 1))  # wraps lm-eval's own
    settings = {"until": ["\n\n"], "temperature": 0, "max_completion_tokens": 4096}
    chat(server.base_url, 4, Same).generate_until(_chats(settings, 8))
    assert "chat requests name" not in capsys.readouterr().err
    assert probed.evidence_document()["tasks"]["t"]["max_tokens"] == [GEN_KWARGS["max_tokens"], 4096]


def test_an_unread_builder_calling_a_wrapped_one_leaves_the_budget_unknown(sim, probed, result_dir) -> None:
    """A builder set on the model object that calls the class's builder (which an earlier model's
    request made the probe wrap) and lowers the budget: unknown, never the class builder's 4096."""
    from lm_eval.models.openai_completions import LocalChatCompletion

    server = sim("never_stop")
    chat(server.base_url, 4).generate_until(_chats({**GEN_KWARGS, "max_tokens": 4096}, 1))  # wraps the class's
    lm = chat(server.base_url, 4)
    lm._create_payload = lambda *a, **k: {**LocalChatCompletion._create_payload(lm, *a, **k), "max_tokens": 512}
    answers = lm.generate_until(_chats({**GEN_KWARGS, "max_tokens": 4096}, 24))
    assert "" not in answers and not (result_dir / contract.SIDECAR_NAME).exists()
    found = probed.evidence_document()["tasks"]["t"]
    assert (found["max_tokens"], found["unknown_budget"], found["observations"]) == ([4096], 24, 25)


@pytest.mark.parametrize("calls", ["the probe's older wrapper", "lm-eval's own builder"])
def test_a_builder_patched_on_while_requests_are_in_flight_is_never_read_as_the_old_one(
    sim, probed, result_dir, monkeypatch, capsys, calls
) -> None:
    """A pipeline that patches a budget-lowering builder on as the first payload is built, while
    eight requests are on their way: what they send is not what the probe's older wrapper
    returns, nor what lm-eval's own builder predicted (the new one may reach no wrapper of the
    probe's), so theirs is unknown, and the later ones' is read through the new builder."""
    from lm_eval.models.openai_completions import LocalChatCompletion

    monkeypatch.setattr(LocalChatCompletion, "_create_payload", LocalChatCompletion._create_payload)
    plain = LocalChatCompletion._create_payload

    def first(self: Any, *args: Any, **kwargs: Any) -> dict:
        # The probe's wrapper of this one, or lm-eval's own (a pipeline that kept it at import).
        inner = LocalChatCompletion.__dict__["_create_payload"] if calls.startswith("the probe") else plain
        LocalChatCompletion._create_payload = lambda me, *a, **k: {**inner(me, *a, **k), "max_tokens": 512}
        return plain(self, *args, **kwargs)

    LocalChatCompletion._create_payload = first
    server = sim("never_stop")
    answers = chat(server.base_url, 8).generate_until(_chats({**GEN_KWARGS, "max_tokens": 4096}, 24))
    assert "" not in answers and not (result_dir / contract.SIDECAR_NAME).exists()
    found = probed.evidence_document()["tasks"]["t"]
    assert found["max_tokens"] in ([], [512]) and found["below_min_max_tokens"] + found["unknown_budget"] == 24
    assert found["unknown_budget"] > 0  # the eight in flight as the builder changed
    said = capsys.readouterr().err.count("payload was built by no payload builder the probe reads")
    assert said == (calls == "lm-eval's own builder")  # once; a reading by the older wrapper is a reading (unknown)


def test_a_reinstall_under_a_pipelines_wrapper_of_the_probes_leaves_one_probe_in_the_chain(sim, result_dir) -> None:
    """A pipeline wraps the probe's amodel_call with functools.wraps; the probe is taken out (the
    pipeline's function stays, the probe's inside it) and installed again: one probe per call,
    not two (two gates a call hung the run), and every other hook back in place (the surviving
    amodel_call once stood for all three, and the sync path ran unprobed)."""
    from lm_eval.models.api_models import TemplateAPI

    from probe.runtime import install
    from probe.runtime.hooking.patching import is_ours

    own = TemplateAPI.__dict__["amodel_call"]
    try:
        assert install.install()
        ours = TemplateAPI.__dict__["amodel_call"]

        @functools.wraps(ours)
        async def pipelines(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await ours(self, *args, **kwargs)

        TemplateAPI.amodel_call = pipelines
        install.uninstall()
        assert install.install()
        chain, layer = [], TemplateAPI.__dict__["amodel_call"]
        while layer is not None:
            chain.append(layer)
            layer = getattr(layer, "__wrapped__", None)
        assert sum(map(is_ours, chain)) == 1 and chain[-1] is own
        assert is_ours(TemplateAPI.__dict__["model_call"]) and is_ours(TemplateAPI.__dict__["generate_until"])
        server = sim("healthy")
        assert "" not in chat(server.base_url, 4).generate_until(_chats(GEN_KWARGS, 8))
        never = sim("never_stop")
        answers = chat(never.base_url, 1).generate_until(_chats({**GEN_KWARGS, "max_tokens": 4096}, 40))
        assert answers.count("") >= 40 - 16 - 1 and (result_dir / contract.SIDECAR_NAME).exists()  # the sync path
    finally:
        install.uninstall()
        TemplateAPI.amodel_call = own


def test_sglang_generates_budget_is_read_in_its_sampling_params() -> None:
    from probe.runtime.api_models.budgets import budget_in, names_a_budget

    payload = {"text": "q", "sampling_params": {"max_new_tokens": 2048, "temperature": 0}}
    assert names_a_budget(payload) and budget_in(payload, chat=False) == 2048
    assert not names_a_budget({"text": "q", "sampling_params": {}}) and not names_a_budget(["not a dict"])


@pytest.mark.parametrize("wrapped", [False, True], ids=["lm-eval's", "a pipeline's plain wrapper"])
@pytest.mark.parametrize("concurrency", [1, 4], ids=["sync", "async"])
def test_a_model_that_sends_max_completion_tokens_alone_trips_by_it_and_warns_of_nothing(
    sim, probed, result_dir, capsys, monkeypatch, concurrency, wrapped
) -> None:
    """lm-eval's OpenAI chat model sends only max_completion_tokens: one budget, judged as one;
    so it is under a pipeline's plain wrapper of its builder (no __wrapped__: lm-eval's own builder
    for the class cannot be found, and what the wrapper sends is read)."""
    from lm_eval.models.openai_completions import OpenAIChatCompletion

    monkeypatch.setenv("OPENAI_API_KEY", "not used")
    if wrapped:
        original = OpenAIChatCompletion._create_payload

        def tweaked(self: Any, *args: Any, **kwargs: Any) -> dict:
            return {**original(self, *args, **kwargs), "reasoning_effort": "low"}

        monkeypatch.setattr(OpenAIChatCompletion, "_create_payload", tweaked)
    server = sim("never_stop")
    settings = {"until": ["\n\n"], "temperature": 0, "max_completion_tokens": 2048}
    answers = _lm_eval_model("openai-chat", server.base_url, concurrency).generate_until(_chats(settings, 40))
    assert answers.count("") >= 40 - 16 - 4
    trip = json.loads((result_dir / contract.SIDECAR_NAME).read_text())["verdict"]
    assert (trip["cause"], trip["max_tokens"]) == (contract.OUTPUT_CAP, [2048])
    assert "chat requests name" not in capsys.readouterr().err


def test_the_summary_counts_what_the_rule_does_not_judge(sim, local_task, tmp_path) -> None:
    """A never-stopping model under a budget below MIN_MAX_TOKENS: every answer cut off, none
    judged; the run's summary says both, not just '0 of 0 cut off'."""
    server = sim("never_stop")
    output = tmp_path / "out"
    lm_eval = local_task.lm_eval_command(server.base_url, "sim", output, 64, 8)
    run = subprocess.run([sys.executable, "-m", "probe", "run", "--result-dir", str(output), "--", *lm_eval],
                         env=offline_env(None), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    (line,) = [line for line in run.stderr.splitlines() if "summary:" in line]
    assert "the probe did not trip: it observed no generation the rule judges" in line
    assert "; 40 observed under a budget the rule does not judge" in line  # local_task: 40 documents
    assert f"most cut off: {local_task.name}, 100.0% of its generations" in line


@pytest.mark.parametrize("budget", [None, 0, -1, True, "2048", 2.5])
def test_a_budget_that_is_no_positive_integer_is_unknown_and_nothing_is_at_its_cap(budget) -> None:
    from probe.runtime.scope.state import Probe

    probe = Probe(contract.Settings())
    request = probe.request(object(), {}, ["p"], budget)
    assert (request.max_tokens, request.is_evidence) == (None, False)
    usage = {"completion_tokens": 4096}
    assert evidence.describe_choices({"choices": [{"finish_reason": None, "text": "x"}], "usage": usage}, None) == []
    (length,) = evidence.describe_choices({"choices": [{"finish_reason": "length", "text": "x"}], "usage": usage}, None)
    (stop,) = evidence.describe_choices({"choices": [{"finish_reason": "stop", "text": "x"}], "usage": usage}, None)
    assert (length.cause, stop.cause) == (contract.LENGTH, None)


def test_a_stop_at_the_cap_is_filed_as_the_output_cap_and_trips(sim, probed, result_dir) -> None:
    """A server that hides the cap: `stop` with completion_tokens == max_tokens."""
    server = sim("hidden_cap")
    answers = completions(server.base_url, num_concurrent=16).generate_until(_instances(prompts(40), "t"))
    assert answers.count("") == 24  # tripped after 16, like an honest `length`
    found = probed.evidence_document()["tasks"]["t"]
    assert found["finish_reasons"]["stop"] == found["observations"] == found["stop_at_cap"]  # as the server said
    assert found["causes"][contract.OUTPUT_CAP] == found["observations"]
    trip = json.loads((result_dir / contract.SIDECAR_NAME).read_text())["verdict"]
    assert (trip["cause"], trip["pathological"], trip["finish_reasons"]) == (contract.OUTPUT_CAP, 16, {"stop": 16})


@pytest.mark.parametrize(
    ("tokens", "max_tokens", "cause"),
    [(2048, 2048, contract.OUTPUT_CAP), (4096, 2048, contract.OUTPUT_CAP), (2047, 2048, None), (0, None, None)],
)
def test_a_stop_is_cut_off_exactly_when_its_own_tokens_reach_the_cap(tokens, max_tokens, cause) -> None:
    response = {"choices": [{"finish_reason": "stop", "text": "x"}], "usage": {"completion_tokens": tokens}}
    (choice,) = evidence.describe_choices(response, max_tokens)
    assert (choice.label, choice.cause, choice.stop_at_cap) == ("stop", cause, cause is not None)
    assert evidence.is_pathological(choice.rule_label) is (cause is not None)


@pytest.mark.parametrize("reason", ["length", "stop", "max_tokens", "eos_token"])
def test_a_budget_spent_reasoning_is_reasoning_whatever_the_server_calls_its_end(reason: str) -> None:
    message = {"role": "assistant", "content": "", "reasoning_content": "let me think " * 100}
    response = {"choices": [{"finish_reason": reason, "message": message}], "usage": {"completion_tokens": 2048}}
    (choice,) = evidence.describe_choices(response, 2048)
    assert (choice.label, choice.cause, choice.rule_label) == (
        reason, contract.REASONING, "length" if reason == "length" else evidence.USAGE_AT_CAP
    )  # fmt: skip
    below = {**response, "usage": {"completion_tokens": 2047}}
    (choice,) = evidence.describe_choices(below, 2048)
    assert choice.cause == (contract.REASONING if reason == "length" else None)


def test_a_stop_in_a_batched_response_cannot_be_told_and_stays_a_stop() -> None:
    """Several prompts per request share one token count: no choice's own count is known."""
    response = {"choices": [{"index": i, "finish_reason": "stop", "text": "x"} for i in range(2)],
                "usage": {"completion_tokens": 4096}}  # fmt: skip
    assert [c.cause for c in evidence.describe_choices(response, 2048)] == [None, None]


def test_every_cause_has_its_words_and_the_main_cause_is_the_most_counted() -> None:
    assert len({cause_words(c) for c in CAUSES}) == len(CAUSES)
    assert all(cause_words(c)[0] and cause_words(c)[1] for c in CAUSES)
    for cause in RULE_CAUSES:
        assert main_cause({cause: 3, contract.ABORTED: 99}) == cause  # aborts are never the rule's cause
    assert main_cause({contract.OUTPUT_CAP: 2, contract.CONTEXT_WINDOW: 2}) == contract.OUTPUT_CAP
    assert main_cause({}) is None and main_cause({contract.ABORTED: 5}) is None


def test_the_runtime_says_a_cause_only_through_the_glossary() -> None:
    """No runtime text names one cause for all of them."""
    runtime = Path(contract.__file__).parent
    for path in runtime.glob("*.py"):
        if path.name == "contract.py":
            continue
        text = path.read_text()
        assert "max_tokens cap" not in text and "does not stop" not in text, path.name
