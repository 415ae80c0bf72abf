"""Streamed responses, reassembled (pure): server-sent events in, the unstreamed response dict out.

:class:`Reassembly` takes a stream's chunks in order and says what new text each choice received.
At the end it gives the response the unstreamed request would have produced, field for field.
Whatever it cannot reassemble with certainty raises :class:`Unassemblable`.
The caller then sends one ordinary request instead.
See docs/api.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"
# The message fields a chat delta spells out in pieces, joined in order.
TEXT_FIELDS = ("content", "reasoning_content", "reasoning")
REASONING_FIELDS = ("reasoning_content", "reasoning")
_TOLD_ORDER = (*REASONING_FIELDS, "content", "text")  # the order the detector is told a choice's fields
# Fields of a response, of a choice and of a delta that the reassembly knows. A field it
# does not know is accepted only while it is null: anything else might be lost.
_TOP = ("id", "object", "created", "model", "system_fingerprint", "service_tier")
_CHOICE = ("finish_reason", "stop_reason", "matched_stop")  # scalars: the last non-null wins
_NULL_ONLY = ("logprobs", "token_ids", "prompt_logprobs", "prompt_token_ids")
_OBJECTS = {"text_completion": "text_completion", "chat.completion.chunk": "chat.completion"}
# Pieces of a field in a row that each extend the one before: the text so far, certainly (new
# text would have doubled 15 times, one token at a time); as many that repeat one text: a token
# repeated, certainly (the text so far would have stayed the same for 15 tokens).
CUMULATIVE_CHAIN = 16


class Unassemblable(ValueError):
    """The stream cannot be turned into the unstreamed response with certainty."""


class UncertainAnswer(Unassemblable):
    """This answer cannot be rebuilt with certainty, though the server streams as it should:
    the next request may stream."""


class EventLines:
    """Server-sent events from the lines of a response body: the ``data`` of each event.

    Lines may come with or without their line ends (:meth:`feed`).
    Or the body comes in pieces cut anywhere (:meth:`feed_chunk`), with no limit on a line's length.
    A comment (``:``) is skipped. An ``event:`` other than ``message``, or a line that is not SSE, is refused.
    """

    def __init__(self) -> None:
        self._data: list[str] = []
        self._partial = bytearray()  # the start of a line whose end has not come yet

    def feed_chunk(self, chunk: bytes) -> list[str]:
        """The events that ``chunk``, the next piece of the body, completes."""
        search = len(self._partial)  # a line end can only be in what is new
        self._partial += chunk
        events: list[str] = []
        begin = 0
        while (end := self._partial.find(b"\n", search)) >= 0:
            events += self.feed(bytes(self._partial[begin : end + 1]))
            begin = search = end + 1
        del self._partial[:begin]
        return events

    def feed(self, line: bytes | str) -> list[str]:
        """The events that ``line`` completes (none, or the one it ends)."""
        try:
            text = line.decode("utf-8") if isinstance(line, bytes) else line
        except UnicodeDecodeError as error:
            raise Unassemblable(f"a line that is not UTF-8: {line[:80]!r}") from error
        text = text.rstrip("\r\n")
        if not text:
            return self._dispatch()
        if text.startswith(":"):
            return []
        name, _, value = text.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
            return []
        if (name == "event" and value == "message") or name in ("id", "retry"):
            return []
        raise Unassemblable(f"not a server-sent event line: {text[:80]!r}")

    def flush(self) -> list[str]:
        """The event being read, when the body ended without its blank line (or its last line
        without its end)."""
        events: list[str] = []
        if self._partial:
            line, self._partial = bytes(self._partial), bytearray()
            events = self.feed(line)
        return events + self._dispatch()

    def _dispatch(self) -> list[str]:
        """The event whose lines were read, if any (a blank line ends it)."""
        if not self._data:
            return []
        data, self._data = "\n".join(self._data), []
        return [data]


@dataclass
class _Chain:
    """A text field whose pieces so far may be the text so far (``_Choice.add_text``)."""

    last: str  # the last non-empty piece
    pieces: int = 1  # non-empty pieces
    grew: int = 0  # pieces that added text to the one before, since the last that shrank
    shrank: int = 0  # pieces that were a part of the one before, outside the chunk ending the choice
    repeats: int = 0  # pieces the same as the one before, in a row, each the only text of its chunk
    alongside: bool = False  # a piece the same as the one before came with another field's text


def _step(last: str, piece: str, ending: bool) -> str:
    """How ``piece`` follows ``last``, read as the text so far.

    "grew": the same text and more. "same": the same text.
    "kept": its end revised (a character decoded, a stop string cut, spaces cleaned up), most of it kept.
    "shrank": a part of it, not at the end. "new": neither, so new text, never the text so far.
    """
    decoded = last.rstrip("\ufffd")  # a character still being decoded may show as U+FFFD
    if piece.startswith(decoded):
        if piece == last:
            return "same"
        return "grew" if len(piece.rstrip("\ufffd")) > len(decoded) else "kept"
    if last.startswith(piece):
        return "kept" if ending else "shrank"
    kept = next((i for i, (a, b) in enumerate(zip(decoded, piece, strict=False)) if a != b), len(piece))
    return "kept" if kept and 2 * kept >= len(decoded) else "new"


@dataclass
class _Choice:
    index: int
    chat: bool
    texts: dict[str, list[str]] = field(default_factory=dict)
    role: str | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    chains: dict[str, _Chain] = field(default_factory=dict)  # the fields that may be the text so far
    new_text: set[str] = field(default_factory=set)  # the fields whose pieces are certainly new text
    touched: set[str] = field(default_factory=set)  # the withheld fields the current chunk added to
    told: dict[str, list[str]] = field(default_factory=dict)  # the pieces the detector is told of, per field
    received: int = 0  # characters of text received, withheld or not

    def add_text(self, name: str, piece: Any, ending: bool = False, alone: bool = True, mirror: bool = False) -> str:
        """Take the next piece of field ``name``; returns the text it tells the detector of.

        ``ending``: in the chunk that ends the choice; ``alone``: the only text of its chunk;
        ``mirror``: the same text as another field of its chunk (told once, under that one).
        Pieces that may be the text so far, not new text, are withheld (``_step``).
        They are handed on once the stream proves them new; ``CUMULATIVE_CHAIN`` grown pieces are refused.
        See docs/api.md.
        """
        if piece is None:
            self.texts.setdefault(name, [])
            return ""
        if not isinstance(piece, str):
            raise Unassemblable(f"choice {self.index}: {name} is {type(piece).__name__}, not text")
        self.texts.setdefault(name, []).append(piece)
        self.received += len(piece)
        if mirror:
            return ""
        self.told.setdefault(name, []).append(piece)
        if not piece or name in self.new_text:
            return piece
        self.touched.add(name)
        chain = self.chains.get(name)
        if chain is None:
            self.chains[name] = _Chain(piece)
            return ""
        step = _step(chain.last, piece, ending)
        if step == "new" and chain.grew > 1:
            # After pieces that grew as the text so far does, a rewrite of it (a gateway that
            # splits its reasoning from its answer anew each time), not the proof of new text.
            step = "kept"
        chain.pieces += 1
        if step == "grew":
            chain.grew += 1
        elif step == "shrank":
            chain.grew = 0
            chain.shrank += 1
        chain.repeats = chain.repeats + 1 if step == "same" and alone else 0
        chain.alongside |= step == "same" and not alone
        chain.last = piece
        # The text so far shrinks once at most (a stop string cut before the last chunk).
        if step == "new" or chain.shrank > 1:
            return self._singles_over(self.touched) + self._handed_on(name)
        if chain.grew >= CUMULATIVE_CHAIN:
            raise Unassemblable(f"choice {self.index}: {chain.grew} pieces of its {name} in a row each extend the one "
                                "before (the server streams the text so far, not what is new)")  # fmt: skip
        if chain.repeats >= CUMULATIVE_CHAIN - 1 and not chain.alongside:
            return self._singles_over(self.touched) + self._handed_on(name)  # a token repeated
        return ""

    def _handed_on(self, name: str) -> str:
        """Field ``name`` is new text: every piece so far, handed on."""
        del self.chains[name]
        self.new_text.add(name)
        return "".join(self.told.get(name, ()))

    def _singles_over(self, going_on: set[str]) -> str:
        """The fields withheld after a single piece (the same either way) that are not among
        ``going_on``, handed on, reasoning first: a field is over when the next goes on."""
        over = [n for n, chain in self.chains.items() if n not in going_on and chain.pieces == 1]
        return "".join(self._handed_on(name) for name in sorted(over, key=_TOLD_ORDER.index))

    def settle(self) -> str:
        """At the end of a chunk: the single pieces of fields this chunk did not add to.

        They are handed on when a field it added to went on, that is, has more than its first piece.
        """
        touched, self.touched = self.touched, set()
        went_on = any(name in self.new_text or self.chains[name].pieces > 1 for name in touched)
        return self._singles_over(touched) if went_on else ""

    def finish(self) -> str:
        """At the choice's end: every field withheld after a single piece, handed on."""
        return self._singles_over(set())

    def joined(self, name: str) -> str | None:
        pieces = self.texts.get(name)
        return None if pieces is None else "".join(pieces)

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role or "assistant"}
        content = self.joined("content")
        reasoning = any(self.joined(name) for name in REASONING_FIELDS)
        # Both streams open every message with content "". Unstreamed, SGLang (whose choices
        # carry matched_stop) answers None for any empty field; vLLM (whose last chunk of a
        # choice carries stop_reason) answers None for an empty answer after reasoning, and for
        # one without reasoning "" (no reasoning parser) or, with some parsers, None. Another
        # server may answer an empty answer either way: not ours to guess.
        sglang, vllm = "matched_stop" in self.fields, "stop_reason" in self.fields
        if not content and not sglang and not (vllm and reasoning):
            said = f'choice {self.index}: an empty answer, which this server may send as null or as ""'
            raise UncertainAnswer(said) if vllm else Unassemblable(said)
        message["content"] = content or None
        for name in REASONING_FIELDS:
            if name in self.texts:
                message[name] = (self.joined(name) or None) if sglang else self.joined(name)
        return message

    def body(self) -> dict[str, Any]:
        if "finish_reason" not in self.fields or self.fields["finish_reason"] is None:
            raise Unassemblable(f"choice {self.index} never ended")
        if self.chains:
            name = next(iter(self.chains))
            raise UncertainAnswer(f"choice {self.index}: each piece of its {name} extends or repeats the one "
                                  "before, as the text so far would: what is new cannot be told")  # fmt: skip
        if any(_split_surrogate(self.joined(name) or "") for name in self.texts):
            raise Unassemblable(f"choice {self.index}: a character split across chunks (a lone surrogate)")
        body: dict[str, Any] = {"index": self.index}
        if self.chat:
            body["message"] = self.message()
        else:
            body["text"] = self.joined("text") or ""
        body.update(self.fields)
        return body


class Reassembly:
    """One streamed response being reassembled.

    Promise: for any response the server could send unstreamed, the chunks it streams for
    it, fed in order, give that response back from :meth:`response` (tests/test_stream.py
    checks this as a property); anything else raises :class:`Unassemblable`.
    """

    def __init__(self, n_choices: int) -> None:
        self.n_choices = n_choices
        self._top: dict[str, Any] = {}
        self._choices: dict[int, _Choice] = {}
        self._usage: dict[str, Any] | None = None
        self.done = False

    def add_event(self, data: str) -> list[tuple[int, str]]:
        """Take one event's data; returns (choice index, new text) for each choice it extended."""
        if self.done:
            raise Unassemblable("an event after [DONE]")
        if data.strip() == DONE:
            self.done = True
            return []
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError) as error:  # RecursionError: JSON nested past Python's stack
            raise Unassemblable(f"an event that is not JSON: {data[:80]!r}") from error
        return self.add_chunk(chunk)

    def add_chunk(self, chunk: Any) -> list[tuple[int, str]]:
        if not isinstance(chunk, dict):
            raise Unassemblable("an event that is not a JSON object")
        if "error" in chunk:
            raise Unassemblable(f"an error event: {str(chunk['error'])[:200]}")
        for name, value in chunk.items():
            if name in _TOP:
                self._top.setdefault(name, value)
            elif name == "usage":
                if value is not None:
                    self._usage = _object(value, "usage")
            elif name != "choices" and value is not None:
                raise Unassemblable(f"an unknown field in a chunk: {name}")
        kind = self._top.get("object")
        if not isinstance(kind, str) or kind not in _OBJECTS:
            raise Unassemblable(f"an unknown kind of chunk: {kind!r}")
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise Unassemblable("a chunk without a list of choices")
        return [update for choice in choices if (update := self._add_choice(_object(choice, "choice")))[1]]

    def _add_choice(self, raw: dict[str, Any]) -> tuple[int, str]:
        index = raw.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < self.n_choices:
            raise Unassemblable(f"a choice index out of range: {index!r}")
        chat = self._top["object"] == "chat.completion.chunk"
        choice = self._choices.setdefault(index, _Choice(index, chat))
        ended = choice.fields.get("finish_reason") is not None  # by an earlier chunk
        ending = raw.get("finish_reason") is not None  # by this one
        received, new = choice.received, ""
        for name, value in raw.items():
            if name == "index":
                continue
            if name == "text" and not chat:
                new += choice.add_text("text", value, ending)
            elif name == "delta" and chat:
                new += self._add_delta(choice, _object(value, "delta"), ending)
            elif name in _CHOICE:
                if value is not None or name not in choice.fields:
                    choice.fields[name] = value
            elif name in _NULL_ONLY:
                if value is not None:
                    raise Unassemblable(f"choice {index} carries {name}")
                choice.fields.setdefault(name, None)
            elif value is not None:
                raise Unassemblable(f"choice {index} carries an unknown field: {name}")
        if ended and choice.received > received:
            raise Unassemblable(f"choice {index} has text after its end")
        new += choice.settle()
        if not ended and choice.fields.get("finish_reason") is not None:
            new += choice.finish()
        return index, new

    @staticmethod
    def _add_delta(choice: _Choice, delta: dict[str, Any], ending: bool) -> str:
        # vLLM may spell its reasoning under both names at once: one text, told once.
        mirror = bool(delta.get("reasoning")) and delta.get("reasoning") == delta.get("reasoning_content")
        texts = [
            n for n in TEXT_FIELDS if isinstance(delta.get(n), str) and delta[n] and not (mirror and n == "reasoning")
        ]
        new = ""
        for name, value in delta.items():
            if name in TEXT_FIELDS:
                new += choice.add_text(name, value, ending, len(texts) <= 1, mirror and name == "reasoning")
            elif name == "role":
                choice.role = choice.role or value
            elif value is not None and value != []:  # tool calls, refusals, audio: not ours to rebuild
                raise Unassemblable(f"choice {choice.index} carries {name}")
        return new

    def answering(self, index: int) -> bool:
        """Whether choice ``index`` has gone on from its reasoning to its answer."""
        choice = self._choices.get(index)
        return (
            choice is not None
            and bool(choice.told.get("content"))
            and any(choice.told.get(name) for name in REASONING_FIELDS)
        )

    @property
    def ended(self) -> bool:
        """Every choice has ended: nothing more is being generated (the usage and ``[DONE]`` may
        still be missing)."""
        return sorted(self._choices) == list(range(self.n_choices)) and all(
            choice.fields.get("finish_reason") is not None for choice in self._choices.values()
        )

    def response(self) -> dict[str, Any]:
        """The unstreamed response; raises :class:`Unassemblable` when the stream was incomplete."""
        if not self.done:
            raise Unassemblable("the stream ended before [DONE]")
        if self._usage is None:
            raise Unassemblable("the stream carried no usage")
        if sorted(self._choices) != list(range(self.n_choices)):
            raise Unassemblable(f"{len(self._choices)} choices for {self.n_choices} prompts")
        response = dict(self._top)
        response["object"] = _OBJECTS[response["object"]]
        response["choices"] = [self._choices[i].body() for i in range(self.n_choices)]
        response["usage"] = self._usage
        return response


def _split_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone surrogate (the halves of one character sent apart)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Unassemblable(f"a {what} that is not a JSON object")
    return value


def streamable(payload: Any) -> int | None:
    """How many choices a streamed ``payload`` must come back with, or None when it must not stream.

    It must not when it asks for log-probabilities, an echo, several choices per prompt or a stream.
    Nor when it is not a generate payload.
    """
    if not isinstance(payload, dict) or "stream" in payload or "stream_options" in payload:
        return None
    if any(payload.get(name) for name in ("logprobs", "top_logprobs", "echo")):
        return None
    if payload.get("n", 1) != 1 or payload.get("best_of", 1) != 1:
        return None
    if "messages" in payload:
        return 1 if isinstance(payload["messages"], list) else None
    prompt = payload.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt)):
        return 1
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        return len(prompt)
    return None


def streamed(payload: dict[str, Any]) -> dict[str, Any]:
    """``payload`` asking for a stream that ends with a usage chunk."""
    return {**payload, "stream": True, "stream_options": {"include_usage": True}}


def unstreamed_answer(body: Any, n_choices: int) -> bool:
    """Whether ``body``, the JSON a server sent back instead of a stream, is the unstreamed
    response itself (the server ignored ``stream``): a completion or chat completion with
    ``n_choices`` choices, each of them ended, their indices each of ``0 .. n_choices - 1`` once
    (lm-eval and the probe place a choice by its index). Anything else (an error, a partial
    body) is not taken for an answer."""
    if not isinstance(body, dict) or body.get("object") not in ("text_completion", "chat.completion"):
        return False
    choices = body.get("choices")
    if not isinstance(choices, list) or len(choices) != n_choices:
        return False
    if not all(isinstance(choice, dict) and choice.get("finish_reason") is not None for choice in choices):
        return False
    indices = [choice.get("index") for choice in choices]
    return all(type(i) is int for i in indices) and sorted(indices) == list(range(n_choices))


def passing_failure(status: int | None) -> bool:
    """Whether an HTTP ``status`` says the server was briefly unable (a timeout, too many
    requests, a server error), not that it cannot stream: the next request may stream."""
    return status is not None and (status in (408, 425, 429) or 500 <= status <= 599)
