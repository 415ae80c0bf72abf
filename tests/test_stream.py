"""The reassembly of streamed responses (probe/runtime/core/stream.py), pure: for any response a
server could send, streaming it as vLLM does and reassembling gives the same dict; anything
that cannot be reassembled with certainty is refused, never guessed."""

from __future__ import annotations

import contextlib
import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.runtime.core.stream import (
    EventLines,
    Reassembly,
    Unassemblable,
    UncertainAnswer,
    passing_failure,
    streamable,
    streamed,
    unstreamed_answer,
)

# Imports no lm-eval: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
REASONS = st.sampled_from(["stop", "length", "repetition", "abort"])
USAGE = st.fixed_dictionaries({"prompt_tokens": st.integers(0, 99), "completion_tokens": st.integers(0, 99)})


@st.composite
def responses(draw: st.DrawFn) -> dict[str, Any]:
    """A response as vLLM, or another server that streams as vLLM does, sends it unstreamed
    (the fields a stream also carries)."""
    chat, vllm = draw(st.booleans()), draw(st.booleans())
    n = 1 if chat else draw(st.integers(1, 4))
    choices = []
    for index in range(n):
        choice: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": draw(REASONS)}
        if vllm:  # vLLM's choices always carry it; another server's may not
            choice["stop_reason"] = draw(st.none() | st.integers(0, 9) | st.text(max_size=3))
        if chat:
            message: dict[str, Any] = {"role": "assistant"}
            reasoning = draw(st.sampled_from([None, "reasoning_content", "reasoning"]))
            thinking = draw(TEXT) if reasoning else ""
            if reasoning:
                message[reasoning] = thinking
            content = draw(TEXT)
            # vLLM's rule: empty content after reasoning is None, and "" otherwise.
            message["content"] = None if not content and thinking else content
            choice["message"] = message
        else:
            choice["text"] = draw(TEXT)
        choices.append(choice)
    kind = "chat.completion" if chat else "text_completion"
    return {"id": draw(st.text(max_size=8)), "object": kind, "created": draw(st.integers(0, 2**31)),
            "model": "m", "choices": choices, "usage": draw(USAGE)}  # fmt: skip


def pieces(draw: st.DrawFn, text: str) -> list[str]:
    """``text`` split at arbitrary points (empty pieces included, as servers send them)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def server_chunks(draw: st.DrawFn, response: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunks a vLLM-like server streams for ``response``, choices interleaved at random."""
    chat = response["object"] == "chat.completion"
    head = {"id": response["id"], "object": "chat.completion.chunk" if chat else "text_completion",
            "created": response["created"], "model": response["model"]}  # fmt: skip
    queues: list[list[dict[str, Any]]] = []
    for choice in response["choices"]:
        index, queue = choice["index"], []
        extra = {name: None for name in ("stop_reason",) if name in choice}
        if chat:
            message = choice["message"]
            queue.append({"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None})
            for name in [n for n in ("reasoning_content", "reasoning", "content") if n in message]:
                for piece in pieces(draw, message.get(name) or ""):
                    queue.append({"index": index, "delta": {name: piece}, "finish_reason": None, **extra})
        else:
            for piece in pieces(draw, choice["text"]):
                queue.append({"index": index, "text": piece, "finish_reason": None, **extra})
        ending = {k: choice[k] for k in ("logprobs", "finish_reason", "stop_reason") if k in choice}
        queue.append({"index": index, **({"delta": {}} if chat else {"text": ""}), **ending})
        queues.append(queue)
    chunks = []
    while any(queues):
        queue = draw(st.sampled_from([q for q in queues if q]))
        chunks.append({**head, "choices": [queue.pop(0)]})
    chunks.append({**head, "choices": [], "usage": response["usage"]})
    return chunks


def reassemble(lines: list[str], n: int) -> tuple[dict[str, Any], dict[int, str]]:
    events, whole, seen = EventLines(), Reassembly(n), {}
    for line in lines:
        for data in events.feed(line):
            for index, text in whole.add_event(data):
                seen[index] = seen.get(index, "") + text
    for data in events.flush():
        whole.add_event(data)
    return whole.response(), seen


def sse(chunks: list[Any], done: bool = True) -> list[str]:
    lines = []
    for chunk in chunks:
        lines += [f"data: {json.dumps(chunk)}\n", "\n"]
    return lines + (["data: [DONE]\n", "\n"] if done else [])


def _maybe_so_far(chunks: list[dict[str, Any]]) -> bool:
    """Whether some field of some choice of ``chunks`` has a non-empty piece that extends or
    repeats the one before (a character being decoded may show as U+FFFD), or is the start of it
    (a stop string cut), as the text so far does."""
    fields: dict[tuple[int, str], list[str]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            texts = choice.get("delta") or {"text": choice.get("text")}
            for name, value in texts.items():
                if isinstance(value, str) and value:
                    fields.setdefault((choice["index"], name), []).append(value)
    return any(
        b.startswith(a.rstrip("\ufffd") or a) or a.startswith(b)
        for pieces in fields.values()
        for a, b in itertools.pairwise(pieces)
    )


def _said_by_vllm(response: dict[str, Any]) -> bool:
    return all("stop_reason" in choice for choice in response["choices"])


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_any_response_streamed_as_the_server_would_reassembles_into_itself(data: st.DataObject) -> None:
    response = data.draw(responses())
    chunks = server_chunks(data.draw, response)
    vllm = _said_by_vllm(response)
    thought = [
        any(c.get("message", {}).get(n) for n in ("reasoning_content", "reasoning")) for c in response["choices"]
    ]
    empty = ["message" in c and not c["message"]["content"] for c in response["choices"]]
    try:
        reassemble(sse(chunks), len(response["choices"]))
    except UncertainAnswer as refused:
        if "extends or repeats" in str(refused):
            # Uncertain only where a piece extends or repeats the one before, as the text so far does.
            assert _maybe_so_far(chunks)
            return
    except Unassemblable:
        pass  # an empty answer: below
    if any(e and not (vllm and t) for e, t in zip(empty, thought, strict=True)):
        # An empty answer, unless vLLM says it came after reasoning (null): from vLLM with a
        # reasoning parser, or from a server that does not say it is vLLM (or SGLang), it may be
        # null or "" unstreamed, and the stream cannot tell which.
        with pytest.raises(UncertainAnswer if vllm else Unassemblable, match="an empty answer"):
            reassemble(sse(chunks), len(response["choices"]))
        return
    rebuilt, seen = reassemble(sse(chunks), len(response["choices"]))
    assert rebuilt == response
    # The probe saw, per choice, exactly the text the choice holds, in order.
    for choice in response["choices"]:
        message = choice.get("message", {})
        fields = ("reasoning_content", "reasoning", "content")
        full = choice.get("text") or "".join(message.get(k) or "" for k in fields)
        assert seen.get(choice["index"], "") == full


def _healthy() -> list[dict[str, Any]]:
    head = {"id": "x", "object": "text_completion", "model": "m"}
    return [{**head, "choices": [{"index": 0, "text": "hi", "finish_reason": None}]},
            {**head, "choices": [{"index": 0, "text": "", "finish_reason": "stop"}]},
            {**head, "choices": [], "usage": {"completion_tokens": 1}}]  # fmt: skip


def test_a_plain_stream_reassembles() -> None:
    rebuilt, _ = reassemble(sse(_healthy()), 1)
    assert rebuilt["choices"] == [{"index": 0, "text": "hi", "finish_reason": "stop"}]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda c: c[:2], "no usage"),
        (lambda c: [c[0], {"error": {"message": "boom"}}, *c[1:]], "error event"),
        (lambda c: [c[0], *c[2:]], "never ended"),
        (lambda c: [{**c[0], "choices": [{**c[0]["choices"][0], "logprobs": {"x": 1}}]}, *c[1:]], "logprobs"),
        (lambda c: [{**c[0], "choices": [{**c[0]["choices"][0], "surprise": 1}]}, *c[1:]], "unknown field"),
        (lambda c: [{**c[0], "surprise": [1]}, *c[1:]], "unknown top field"),
        (lambda c: [{**c[0], "choices": [{**c[0]["choices"][0], "index": 1}]}, *c[1:]], "index out of range"),
        (lambda c: [{**c[0], "object": "something.else"}, *c[1:]], "unknown kind"),
        (lambda c: [{**c[0], "choices": [{**c[0]["choices"][0], "text": 5}]}, *c[1:]], "text not text"),
        (lambda c: ["not an object", *c], "not an object"),
        (lambda c: [{**c[0], "object": []}, *c[1:]], "a kind that is not text"),  # a TypeError escaped
    ],
)
def test_what_cannot_be_reassembled_with_certainty_is_refused(change: Any, reason: str) -> None:
    with pytest.raises(Unassemblable):
        reassemble(sse(change(_healthy())), 1)


@pytest.mark.parametrize(
    ("thinking", "ending", "content"),
    [
        ("hmm", {"stop_reason": None}, None),  # vLLM after reasoning: null
        ("hmm", {}, Unassemblable),  # a server that does not say it is vLLM: null or ""
        ("", {"stop_reason": None}, UncertainAnswer),  # vLLM with a reasoning parser: null or "" by parser
        ("", {}, Unassemblable),
    ],
)
def test_an_empty_answer_is_rebuilt_only_where_the_server_says_what_it_would_be(
    thinking: str, ending: dict[str, Any], content: Any
) -> None:
    # A reasoning model that spent its budget thinking, or stopped at once (vLLM with the
    # deepseek_r1 parser: a reasoning delta "", and content null unstreamed). Where the stream
    # cannot tell null from "" (which lm-eval logs and caches differently), the request falls
    # back; the answer's own uncertainty (UncertainAnswer) leaves the next request streamed.
    head = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {**head, "choices": [{"index": 0, "delta": {"reasoning": thinking}, "finish_reason": None}]},
              {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "length", **ending}]},
              {**head, "choices": [], "usage": {"completion_tokens": 1}}]  # fmt: skip
    if content is not None:
        with pytest.raises(content, match="an empty answer") as refused:
            reassemble(sse(chunks), 1)
        assert isinstance(refused.value, UncertainAnswer) == (content is UncertainAnswer)
        return
    rebuilt, _ = reassemble(sse(chunks), 1)
    assert rebuilt["choices"][0]["message"] == {"role": "assistant", "content": None, "reasoning": thinking}


def test_a_tool_call_in_a_chat_delta_is_refused() -> None:
    head = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
    chunk = {**head, "choices": [{"index": 0, "delta": {"tool_calls": [{"id": "t"}]}, "finish_reason": "stop"}]}
    with pytest.raises(Unassemblable):
        reassemble(sse([chunk, {**head, "choices": [], "usage": {}}]), 1)


@pytest.mark.parametrize(
    "lines",
    [
        ['{"id": 1}\n'],  # JSON, not SSE
        ["event: error\n", "data: {}\n", "\n"],
        ["data: not json\n", "\n"],
        [*sse(_healthy(), done=False)],  # the body ended before [DONE]
        [*sse(_healthy()), "data: {}\n", "\n"],  # an event after [DONE]
    ],
)
def test_a_body_that_is_not_a_complete_event_stream_is_refused(lines: list[str]) -> None:
    with pytest.raises(Unassemblable):
        reassemble(lines, 1)


def test_comments_crlf_bytes_and_a_missing_final_blank_line_are_read() -> None:
    lines = [b": keep-alive\r\n", *[line.encode().replace(b"\n", b"\r\n") for line in sse(_healthy())][:-1]]
    events, whole = EventLines(), Reassembly(1)
    for line in lines:
        for data in events.feed(line):
            whole.add_event(data)
    for data in events.flush():
        whole.add_event(data)
    assert whole.response()["choices"][0]["text"] == "hi"


@pytest.mark.parametrize(
    ("payload", "n"),
    [
        ({"prompt": "a", "max_tokens": 9}, 1),
        ({"prompt": ["a", "b", "c"], "max_tokens": 9}, 3),
        ({"prompt": [[1, 2], [3]], "max_tokens": 9}, 2),
        ({"prompt": [1, 2, 3], "max_tokens": 9}, 1),
        ({"messages": [{"role": "user", "content": "a"}], "max_tokens": 9}, 1),
        ({"prompt": "a", "n": 1}, 1),
        ({"prompt": "a", "logprobs": 1}, None),
        ({"prompt": "a", "echo": True}, None),
        ({"messages": [], "top_logprobs": 2}, None),
        ({"prompt": "a", "n": 2}, None),
        ({"prompt": "a", "best_of": 3}, None),
        ({"prompt": "a", "stream": False}, None),
        ({"prompt": []}, None),
        ({"prompt": None}, None),
        ([], None),
    ],
)
def test_only_payloads_with_one_plain_choice_per_prompt_are_streamed(payload: Any, n: int | None) -> None:
    assert streamable(payload) == n


@given(responses())
def test_any_unstreamed_response_sent_instead_of_a_stream_is_taken_for_the_answer(response: dict[str, Any]) -> None:
    assert unstreamed_answer(response, len(response["choices"]))
    assert not unstreamed_answer(response, len(response["choices"]) + 1)


@pytest.mark.parametrize(
    "body",
    [
        {"error": {"message": "stream_options is not supported"}},
        {"object": "error", "message": "bad", "choices": [{"index": 0, "finish_reason": "stop"}]},
        {"object": "text_completion", "choices": [{"index": 0, "text": "half", "finish_reason": None}]},
        {"object": "text_completion", "choices": [{"index": 1, "text": "x", "finish_reason": "stop"}]},
        {"object": "text_completion", "choices": [{"index": True, "text": "x", "finish_reason": "stop"}]},
        {"object": "text_completion", "choices": "x"},
        {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        [],
        None,
    ],
)
def test_a_json_reply_that_is_not_a_whole_answer_is_not_taken_for_one(body: Any) -> None:
    assert not unstreamed_answer(body, 1)


def test_a_json_reply_whose_choices_come_in_another_order_is_taken_for_the_answer() -> None:
    choices = [{"index": i, "text": str(i), "finish_reason": "stop"} for i in (2, 0, 1)]
    assert unstreamed_answer({"object": "text_completion", "choices": choices}, 3)
    twice = [{**choices[0], "index": 0}, *choices[1:]]
    assert not unstreamed_answer({"object": "text_completion", "choices": twice}, 3)


def test_a_streamed_payload_asks_for_usage_and_leaves_the_original_alone() -> None:
    payload = {"prompt": "a", "max_tokens": 9}
    assert streamed(payload) == {**payload, "stream": True, "stream_options": {"include_usage": True}}
    assert payload == {"prompt": "a", "max_tokens": 9}


def _sglang(deltas: list[dict[str, Any]], reason: str = "stop") -> list[str]:
    """The chunks SGLang streams for a chat answer: nulls spelt out, ``matched_stop`` on every choice."""
    head = {"id": "s", "object": "chat.completion.chunk", "created": 1, "model": "m", "usage": None}
    empty = {"role": None, "content": None, "reasoning_content": None, "tool_calls": None}
    opener = {"index": 0, "delta": {**empty, "role": "assistant", "content": ""}, "logprobs": None,
              "finish_reason": None, "matched_stop": None}  # fmt: skip
    chunks = [{**head, "choices": [opener]}]
    for delta in deltas:
        choice = {"index": 0, "delta": {**empty, **delta}, "logprobs": None, "finish_reason": None}
        choice["matched_stop"] = None
        chunks.append({**head, "choices": [choice]})
    ending = {"index": 0, "delta": {**empty, "content": ""}, "logprobs": None, "finish_reason": reason,
              "matched_stop": 2 if reason == "stop" else None}  # fmt: skip
    chunks += [{**head, "choices": [ending]}, {**head, "choices": [], "usage": {"completion_tokens": 3}}]
    return sse(chunks)


@pytest.mark.parametrize(
    ("deltas", "reason", "message"),
    [
        # SGLang's unstreamed message: content=text if text else None, and so reasoning_content.
        ([], "stop", {"role": "assistant", "content": None, "reasoning_content": None}),
        ([{"reasoning_content": "hm"}], "length", {"role": "assistant", "content": None, "reasoning_content": "hm"}),
        ([{"content": "4"}], "stop", {"role": "assistant", "content": "4", "reasoning_content": None}),
    ],
)
def test_an_sglang_stream_reassembles_into_sglangs_unstreamed_message(deltas, reason, message) -> None:
    rebuilt, _ = reassemble(_sglang(deltas, reason), 1)
    assert rebuilt["choices"][0]["message"] == message


def test_a_line_that_is_not_utf8_is_refused_so_that_the_request_falls_back() -> None:
    # A UnicodeDecodeError escaped the fallback: lm-eval retried the same stream until it crashed.
    with pytest.raises(Unassemblable):
        EventLines().feed(b'data: {"text": "4\xff2"}\n')


def _pieces_stream(pieces: list[str], ending: str = "") -> list[str]:
    """A completion streamed as ``pieces``, then a last chunk with ``ending`` and the finish reason."""
    head = {"id": "x", "object": "text_completion", "model": "m"}
    chunks = [{**head, "choices": [{"index": 0, "text": piece, "finish_reason": None}]} for piece in pieces]
    chunks.append({**head, "choices": [{"index": 0, "text": ending, "finish_reason": "stop"}]})
    return sse([*chunks, {**head, "choices": [], "usage": {"completion_tokens": len(pieces)}}])


def _fed(lines: list[str]) -> str:
    """The text the detector was told of, up to the end of the stream or its refusal."""
    events, whole, seen = EventLines(), Reassembly(1), ""
    with contextlib.suppress(Unassemblable):
        for line in lines:
            for data in events.feed(line):
                seen += "".join(text for _, text in whole.add_event(data))
    return seen


def test_a_stream_of_the_text_so_far_is_refused_and_never_fed_to_the_detector() -> None:
    # A gateway that sends each chunk's text so far instead of what is new: joined, the answer
    # would be every prefix one after the other, and the detector would take it for a loop.
    answer = "The answer is that seventeen times three is fifty-one."
    so_far = [answer[: i + 1] for i in range(0, len(answer), 3)]
    for ending in ("", answer):  # its last chunk with no text, or (as such gateways do) the whole
        with pytest.raises(Unassemblable, match="text so far") as refused:
            reassemble(_pieces_stream(so_far, ending), 1)
        assert not isinstance(refused.value, UncertainAnswer)  # the server's way of streaming
        assert _fed(_pieces_stream(so_far, ending)) == ""


@pytest.mark.parametrize(
    ("pieces", "ending"),
    [
        (["The", "The cat", "The cat sat"], "The cat sat"),  # the whole text again at the end
        (["The cat sat"], "The cat sat"),
        (["Caf", "Caf", "Café au lait"], ""),  # a token with no text yet: the same text again
        (["The cat", "The cat sat", "The cat sat\n"], "The cat sat"),  # a stop string cut at the end
        (["ab", "ab", "abab"], ""),
        (["a"] * 15, ""),
        (["Caf", "Caf\ufffd", "Café", "Café au"], "Café au"),  # a character shown as U+FFFD until decoded
        # Round 23: revised before growing, or a first character still being decoded.
        (["42\n", "42"], ""),
        (["I do n", "I don't"], ""),
        (["I do n"], "I don't"),
        (["\ufffd", "是"], ""),
        (["\ufffd", "\ufffd", "😀"], ""),
        (["The cat", "The cat sat", "The cat sat\n", "The cat sat"], ""),  # a stop string cut before the end
        (["I", "I do", "I do n", "I don't", "I don't know."], ""),  # spaces cleaned up on the way
    ],
)
def test_an_answer_that_may_be_the_text_so_far_is_uncertain_and_never_fed_to_the_detector(
    pieces: list[str], ending: str
) -> None:
    # Shorter, it may be new text that doubled, or one token repeated: this answer falls back
    # (hostile rounds 19 and 20: joined, each of these changed the answer).
    with pytest.raises(UncertainAnswer, match="extends or repeats the one before"):
        reassemble(_pieces_stream(pieces, ending), 1)
    assert _fed(_pieces_stream(pieces, ending)) == ""


@pytest.mark.parametrize(
    "pieces",
    [
        ["a"] * 40,  # one token repeated: the loop the detector is for
        ["!!", "!"] * 20,  # the same, as many tokens a chunk as were accepted (speculative decoding)
        ["!", "!!!", "!!", "!!!!", "!"] * 8,
        ["!"] + ["!!!!"] * 40,  # the same, a few tokens a chunk after the first (speculative decoding)
        ["The", " cat", " sat."],
        ["a", "a", "b"],
        ["x", "xy", "q"],
        ["only one piece"],
        ["", "a", "", "ab", "c", "d"],  # two in a row that neither extend nor repeat: new text
    ],
)
def test_new_text_is_reassembled_and_fed_to_the_detector_in_order(pieces: list[str]) -> None:
    rebuilt, seen = reassemble(_pieces_stream(pieces), 1)
    assert rebuilt["choices"][0]["text"] == seen[0] == "".join(pieces)


def _chat_stream(deltas: list[dict[str, Any]]) -> list[str]:
    head = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    chunks += [{**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": None}]})
    return sse([*chunks, {**head, "choices": [], "usage": {"completion_tokens": len(deltas)}}])


@pytest.mark.parametrize("content_first", [False, True], ids=["reasoning-first", "content-first"])
@pytest.mark.parametrize("words", [6, 40])
def test_a_chat_stream_that_restates_every_field_so_far_is_refused_and_never_fed(
    content_first: bool, words: int
) -> None:
    # Each chunk repeats the reasoning so far beside the answer so far: the reasoning's repeats
    # came with other text, so they are not a token repeated (hostile round 21: 17 copies of the
    # reasoning reached the detector, a flag the refusal could not take back), and the answer
    # going on does not end the reasoning (round 22: with content first, as vLLM orders a delta).
    reasoning, said = "Let me think about it carefully.", [f"w{i}" for i in range(words)]

    def delta(content: str) -> dict[str, str]:
        return (
            {"content": content, "reasoning": reasoning}
            if content_first
            else {"reasoning": reasoning, "content": content}
        )

    deltas = [delta("")] + [delta(" ".join(said[: i + 1])) for i in range(words)]
    with pytest.raises(UncertainAnswer if words < 16 else Unassemblable, match=r"extends? (or repeats )?the one"):
        reassemble(_chat_stream(deltas), 1)
    assert _fed(_chat_stream(deltas)) == ""


def test_the_detector_is_told_a_short_reasoning_before_the_answer_in_one_delta_content_first() -> None:
    rebuilt, seen = reassemble(
        _chat_stream([{"content": " 4", "reasoning": "ok"}, {"content": "2"}, {"content": "."}]), 1
    )
    assert rebuilt["choices"][0]["message"]["content"] == " 42." and seen[0] == "ok 42."


def test_a_loop_of_replacement_characters_is_never_taken_for_the_text_so_far() -> None:
    # U+FFFD pieces (a server that sends undecodable bytes as they come): more of them is no
    # more text, so they never grow a chain (round 22: refused as the text so far, and the
    # server then streamed no more). What they are cannot be told: this answer falls back.
    pieces = ["\ufffd" * (1 + i * 7 % 3) for i in range(60)]
    with pytest.raises(UncertainAnswer):
        reassemble(_pieces_stream(pieces), 1)


def test_reasoning_spelt_under_both_names_at_once_is_told_to_the_detector_once() -> None:
    pieces = [
        f" {word}"
        for word in ["first", "we", "add", "the", "two", "numbers", "then", "we", "check", "the", "sum", "twice"]
    ]
    rebuilt, seen = reassemble(_chat_stream([{"reasoning_content": p, "reasoning": p} for p in pieces] +
                                            [{"content": " 42"}]), 1)  # fmt: skip
    message = rebuilt["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == "".join(pieces)
    assert seen[0] == "".join(pieces) + " 42"


@pytest.mark.parametrize(
    "pieces",
    [
        ["I do n", "I don't think it does n", "I don't think it doesn't matter"],  # two revisions first
        ["\ufffd", "🤔 I do n", "🤔 I don't"],  # a character being decoded, then a revision
    ],
)
def test_a_long_text_so_far_revised_at_its_start_is_refused_and_never_fed(pieces: list[str]) -> None:
    # Round 23: two pieces in a row that did not extend the one before let the prefixes through.
    lines = _pieces_stream(pieces + [pieces[-1] + " w" * i for i in range(1, 30)])
    with pytest.raises(Unassemblable, match="text so far"):
        reassemble(lines, 1)
    assert _fed(lines) == ""


def test_a_gateway_that_splits_reasoning_from_answer_anew_each_time_is_not_taken_for_new_text() -> None:
    # Round 24: the text so far parsed whole at each step: until </think>, all of it is content;
    # then the reasoning moves out and the content starts afresh, a step that looked new.
    thought, answer = "\nEasy.\n", "\n\nThe answer is B."
    content = ["<think>", "<think>\n", "<think>\nEasy", "<think>\nEasy.", "<think>\nEasy.\n"]
    deltas = [{"content": c} for c in content] + [{"reasoning_content": thought, "content": answer[:5]}]
    deltas += [{"content": answer[:i]} for i in range(6, len(answer) + 1, 3)]
    with pytest.raises(UncertainAnswer):
        reassemble(_chat_stream(deltas), 1)


def test_a_choice_ending_with_its_reasoning_and_answer_in_one_chunk_is_told_reasoning_first() -> None:
    head = {"id": "x", "object": "chat.completion.chunk", "model": "m"}
    ending = {"index": 0, "delta": {"content": "B", "reasoning": "Easy."}, "finish_reason": "stop", "stop_reason": None}
    lines = sse([{**head, "choices": [ending]}, {**head, "choices": [], "usage": {"completion_tokens": 3}}])
    rebuilt, seen = reassemble(lines, 1)
    assert rebuilt["choices"][0]["message"]["content"] == "B" and seen[0] == "Easy.B"


def test_reasoning_spelt_under_both_names_in_some_deltas_only_is_told_once() -> None:
    deltas = [{"reasoning_content": "Let me", "reasoning": "Let me"}, {"reasoning": " think"}, {"reasoning": " about"},
              {"reasoning": " it."}, {"content": " 42"}]  # fmt: skip
    assert _fed(_chat_stream(deltas)) == "Let me think about it. 42"


def test_a_character_split_into_lone_surrogates_is_refused() -> None:
    # A gateway slicing by UTF-16 index sends the halves of one character apart (round 23).
    with pytest.raises(Unassemblable, match="surrogate"):
        reassemble(_pieces_stream(["Hi \ud83d", "\ude00!"]), 1)


def test_an_event_nested_deeper_than_pythons_stack_is_refused() -> None:
    # json.loads raised RecursionError, which escaped the fallback: lm-eval retried the same
    # stream until the run died.
    with pytest.raises(Unassemblable, match="not JSON"):
        Reassembly(1).add_event("[" * 100_000 + "]" * 100_000)


def test_text_after_its_choice_ended_is_refused() -> None:
    # Whether the unstreamed answer holds it is not certain: the ordinary request decides.
    head = {"id": "x", "object": "text_completion", "model": "m"}
    chunks = [{**head, "choices": [{"index": 0, "text": "4", "finish_reason": "stop"}]},
              {**head, "choices": [{"index": 0, "text": "2", "finish_reason": None}]},
              {**head, "choices": [], "usage": {"completion_tokens": 2}}]  # fmt: skip
    with pytest.raises(Unassemblable):
        reassemble(sse(chunks), 1)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_body_cut_into_pieces_anywhere_gives_the_events_its_lines_give(data: st.DataObject) -> None:
    # aiohttp's pieces of a body fall anywhere: inside a line, a CRLF, a UTF-8 character.
    body = b": keep-alive\r\n" + "".join(sse(_healthy())).replace("\n", "\r\n").encode()
    body += 'data: {"text": "Ünïcode \u2014 long '.encode() + b"x" * 700_000 + b'"}\n\n'
    cuts = sorted(data.draw(st.sets(st.integers(1, len(body) - 1), max_size=12)))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    by_lines, by_pieces = EventLines(), EventLines()
    expected = [e for line in body.splitlines(keepends=True) for e in by_lines.feed(line)] + by_lines.flush()
    assert [e for piece in pieces for e in by_pieces.feed_chunk(piece)] + by_pieces.flush() == expected
    assert len(expected) == 5 and len(expected[-1]) > 700_000


def test_a_last_line_without_its_end_is_read_at_the_flush() -> None:
    lines = EventLines()
    assert lines.feed_chunk(b'data: {"a": 1}\n\ndata: {"b"') == ['{"a": 1}']
    assert lines.feed_chunk(b": 2}") == [] and lines.flush() == ['{"b": 2}'] and lines.flush() == []


@pytest.mark.parametrize(
    ("status", "passing"),
    [(408, True), (425, True), (429, True), (500, True), (503, True), (599, True),
     (400, False), (404, False), (422, False), (None, False)],
)  # fmt: skip
def test_a_busy_or_failing_server_is_not_taken_for_one_that_cannot_stream(status, passing) -> None:
    assert passing_failure(status) is passing


def test_ended_means_every_choice_has_ended_whether_or_not_the_usage_came() -> None:
    whole, lines = Reassembly(1), EventLines()
    events = [data for line in sse(_healthy(), done=False) for data in lines.feed(line)]
    for data in events[:-2]:
        whole.add_event(data)
        assert not whole.ended
    whole.add_event(events[-2])  # the choice's end
    assert whole.ended
    whole.add_event(events[-1])  # the usage
    assert whole.ended and not whole.done
