"""A simulated OpenAI-compatible server for tests, the demo and the benchmarks.

It serves completions, chat completions and SGLang's ``/generate`` on 127.0.0.1. It behaves like a
chosen kind of model (``MODES``), with optional answer shapes and stream quirks. A stream
reassembles into exactly the unstreamed body, which follows vLLM's. A token clock makes generations
take time. A dropped request counts its tokens so far, and counts as aborted. ``GET /stats`` returns
the counters. See docs/simserver.md.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import re
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from probe.runtime.core.degeneration import THINKING_ENDS

LOOPS = ("loop_short", "loop_paragraph", "loop_near", "random")
MODES = (
    "never_stop", "healthy", "mixed", "repetition", "window", "hidden_cap", "reasoning", "empty", "malformed", *LOOPS,
)  # fmt: skip
STREAM_QUIRKS = (
    None, "refuse", "no_usage", "error_event", "unknown_field", "json", "json_cut",
    "one_event", "busy_once", "held_open", "stall_mid", "drop_mid", "drop_after_last", "drop_once",
    "unlabelled", "so_far", "deep_event",
)  # fmt: skip
# Healthy answers that repeat a block, as real ones do (a restated function, a chorus, JSON records,
# a table's cells): each ends with the healthy answer, and stops on its own.
SHAPES = ("restated", "chorus", "json", "table")
# Seconds between two chunks of a streamed choice on the token clock (vLLM sends one per
# engine step; coalescing keeps the simulated server's own cost small at C=64).
STREAM_TICK = 0.01
WORDS_PER_CHUNK = 8
_WORDS = re.compile(r"\s*\S+|\s+")
# Length profiles of a stopping answer: (median tokens, sigma of the log), None for "short".
# Log-normal, because answer lengths are: a long right tail, never below one token.
LENGTHS: dict[str, tuple[float, float] | None] = {"short": None, "lognormal": (300, 0.6), "reasoning": (3000, 0.5)}
_SUM = re.compile(r"(-?\d+)\s*\+\s*(-?\d+)")


@dataclass
class Stats:
    """What the server saw and did (the benchmarks' ground truth)."""

    generate_requests: int = 0
    loglikelihood_requests: int = 0
    tokens_generated: int = 0
    completed: int = 0
    aborted: int = 0
    generate_request_times: list = field(default_factory=list)
    # Generate requests being generated when each one arrived (itself included), in order.
    in_flight_at_arrival: list = field(default_factory=list)
    # Generate requests answered with finish_reason "stop" when each one arrived, in order.
    stopped_at_arrival: list = field(default_factory=list)
    stopped: int = 0
    streamed: int = 0  # generate requests answered with a stream
    in_flight: int = 0
    last_completed_at: float = 0.0  # time.time() of the last generation that ran to its end


def healthy_answer(prompt: str) -> str:
    """The healthy model's answer: the last ``a + b`` in the prompt, worked out."""
    found = _SUM.findall(prompt)
    if not found:
        return " I do not know."
    a, b = found[-1]
    return f" {int(a) + int(b)}"


def _prompt_text(payload: dict[str, Any]) -> list[str]:
    if "messages" in payload:
        messages = payload.get("messages") or []
        return [" ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))]
    prompt = payload.get("prompt", "")
    return [str(p) for p in prompt] if isinstance(prompt, list) else [str(prompt)]


def _fraction(prompt: str) -> float:
    """A number in [0, 1) fixed by the prompt: the simulated model is deterministic."""
    return int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big") / 2**32


def _at_cap(prompt: str, fraction: float) -> bool:
    return _fraction(prompt) < fraction


def answer_tokens(prompt: str, profile: str, answer: str) -> int:
    """How many tokens a stopping answer to ``prompt`` takes under a length profile (fixed per prompt)."""
    shape = LENGTHS[profile]
    if shape is None:
        return len(answer.split()) + 1
    median, sigma = shape
    # Salted, so that the length does not follow the at-cap choice of the "mixed" mode.
    u = min(max(_fraction("length:" + prompt), 1e-9), 1 - 1e-9)
    return max(1, round(median * math.exp(sigma * statistics.NormalDist().inv_cdf(u))))


class SimServer:
    """The server, run on its own event loop in a background thread.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        mode: str = "never_stop",
        seconds_per_token: float = 0.0,
        cap_fraction: float = 0.5,
        port: int = 0,
        malformed_body: Any = None,
        jitter: float = 0.0,
        loop_marker: str | None = None,
        lengths: str = "short",
        cap_min_chars: int | None = None,
        first_n: int = 0,
        first_reason: str = "error",
        seed: int = 0,
        reasoning_field: str = "reasoning_content",
        stream_quirk: str | None = None,
        cap_loop: str | None = None,
        turn_after: int | None = None,
        default_max_tokens: int | None = None,
        shape: str | None = None,
        shape_fraction: float = 1.0,
    ) -> None:
        if stream_quirk not in STREAM_QUIRKS:
            raise ValueError(f"unknown stream quirk {stream_quirk!r}")
        if cap_loop not in (None, *LOOPS):
            raise ValueError(f"unknown cap_loop {cap_loop!r}; choose one of {', '.join(LOOPS)}")
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if shape not in (None, *SHAPES):
            raise ValueError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
        if lengths not in LENGTHS:
            raise ValueError(f"unknown length profile {lengths!r}; choose one of {', '.join(LENGTHS)}")
        self.lengths = lengths
        self.shape, self.shape_fraction = shape, shape_fraction
        self.mode = mode
        self.default_max_tokens = default_max_tokens
        self.seconds_per_token = seconds_per_token
        self.cap_fraction = cap_fraction
        self.malformed_body = malformed_body if malformed_body is not None else {"choices": "nonsense"}
        self.port = port
        self.jitter = jitter
        self.loop_marker = loop_marker
        self.cap_min_chars = cap_min_chars
        self.first_n = first_n
        self.first_reason = first_reason
        self.seed = seed
        self.reasoning_field = reasoning_field
        self.stream_quirk = stream_quirk
        self._done_once: set[str] = set()  # the ..._once quirks that have happened
        self.cap_loop = cap_loop
        self.turn_after = turn_after
        self.stats = Stats()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SimServer:
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self._start())
            except BaseException as error:  # reported to the starting thread
                failure.append(error)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="simserver", daemon=True)
        self._thread.start()
        ready.wait(30)
        if failure:
            raise failure[0]
        return self

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._completions)
        app.router.add_post("/generate", self._sglang_generate)
        app.router.add_get("/stats", self._stats)
        app.router.add_get("/health", self._health)
        # handler_cancellation: a dropped client cancels the handler, as vLLM aborts.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def stop(self) -> None:
        if self._loop is None:
            return
        future = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)  # type: ignore[union-attr]
        future.result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(30)
        self._loop = None

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return asdict(self.stats)

    # ---- handlers

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.snapshot())

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        chat = request.path.endswith("/chat/completions")
        # As vLLM: a chat request's max_completion_tokens comes first; completions know max_tokens.
        budget = payload.get("max_tokens")
        if chat and payload.get("max_completion_tokens") is not None:
            budget = payload["max_completion_tokens"]
        if not budget and self.default_max_tokens is not None and not payload.get("echo"):
            budget = self.default_max_tokens
        if not budget or payload.get("echo"):
            return self._loglikelihood(payload)
        stream = bool(payload.get("stream"))
        if stream and self.stream_quirk == "refuse" and "stream_options" in payload:
            return web.json_response({"error": {"message": "stream_options is not supported"}}, status=400)
        if stream and self._once("busy_once"):
            return web.json_response({"error": {"message": "the server is busy"}}, status=500)
        max_tokens = int(budget)
        prompts = _prompt_text(payload)
        with self._lock:
            self.stats.generate_requests += 1
            self.stats.generate_request_times.append(time.time())
            first = self.stats.generate_requests <= self.first_n
            turned = self.turn_after is not None and self.stats.generate_requests > self.turn_after
        if first:
            return await self._respond(request, payload, self._first_answer(prompts, chat))
        if self.mode == "malformed":
            return web.json_response(self.malformed_body)
        plans = [self._plan(prompt, max_tokens, turned) for prompt in prompts]
        longest = max(tokens for _, tokens, _ in plans)
        # Jitter stretches each request's clock by up to that fraction, so that requests
        # started together do not all end in the same instant.
        stretch = 1.0 + self.jitter * _fraction(prompts[0])
        with self._lock:
            self.stats.in_flight += 1
            self.stats.in_flight_at_arrival.append(self.stats.in_flight)
            self.stats.stopped_at_arrival.append(self.stats.stopped)
        choices = [
            self._choice(index, reason, text, chat, tokens) for index, (text, tokens, reason) in enumerate(plans)
        ]
        usage = {"completion_tokens": sum(t for _, t, _ in plans), "prompt_tokens": 1}
        kind = "chat.completion" if chat else "text_completion"
        body = {"id": "sim", "object": kind, "model": payload.get("model"), "choices": choices, "usage": usage}
        try:
            if self.stream_quirk == "json_cut":
                return await _cut_short(request, body)
            if stream and self.stream_quirk != "json":
                return await self._stream(request, payload, body, [tokens for _, tokens, _ in plans], stretch)
            await self._generate(longest * stretch, sum(tokens for _, tokens, _ in plans))
        finally:
            with self._lock:
                self.stats.in_flight -= 1
        with self._lock:
            self.stats.stopped += all(reason == "stop" for _, _, reason in plans)
        return web.json_response(body)

    async def _sglang_generate(self, request: web.Request) -> web.Response:
        """SGLang's ``/generate``: one output for a text, a list of them for a list of texts.

        A request without max_new_tokens gets SGLang's default, 128.
        """
        payload = await request.json()
        params = payload.get("sampling_params") or {}
        texts = payload.get("text", "")
        prompts = [str(text) for text in texts] if isinstance(texts, list) else [str(texts)]
        with self._lock:
            self.stats.generate_requests += 1
            self.stats.generate_request_times.append(time.time())
        plans = [self._plan(prompt, int(params.get("max_new_tokens") or 128)) for prompt in prompts]
        await self._generate(max(tokens for _, tokens, _ in plans), sum(tokens for _, tokens, _ in plans))
        outputs = [
            {"text": text, "meta_info": {"finish_reason": {"type": reason}, "completion_tokens": tokens}}
            for text, tokens, reason in plans
        ]
        return web.json_response(outputs if isinstance(texts, list) else outputs[0])

    async def _respond(self, request: web.Request, payload: dict[str, Any], body: Any) -> web.StreamResponse:
        """``body`` as asked: streamed when it can be (a well-formed response), else as JSON."""
        if payload.get("stream") and self.stream_quirk != "json" and _is_response(body):
            return await self._stream(request, payload, body, [0] * len(body["choices"]), 1.0)
        return web.json_response(body)

    async def _stream(
        self, request: web.Request, payload: dict[str, Any], body: dict[str, Any], tokens: list[int], stretch: float
    ) -> web.StreamResponse:
        """Send ``body`` as vLLM streams it, each choice's words as the token clock makes them due."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        with self._lock:
            self.stats.streamed += 1
        head = {"id": body["id"], "object": body["object"] + (".chunk" if body["object"] == "chat.completion" else "")}
        head["model"] = body.get("model")
        pending = [_units(choice) for choice in body["choices"]]
        sent = [0] * len(pending)
        ended = [False] * len(pending)
        so_far: dict[tuple[int, str], str] = {}  # the so_far quirk: each field's text so far
        clocks = [n * stretch * self.seconds_per_token for n in tokens]
        started = time.monotonic()

        async def send(chunk: dict[str, Any]) -> None:
            await response.write(f"data: {json.dumps({**head, **chunk})}\n\n".encode())

        try:
            if "messages" in payload:
                for index in range(len(body["choices"])):
                    opening = {"role": "assistant", "content": ""}  # vLLM's first chunk of every choice
                    await send({"choices": [{"index": index, "delta": opening, "finish_reason": None}]})
            while not all(ended):
                elapsed = time.monotonic() - started
                for index, units in enumerate(pending):
                    if ended[index]:
                        continue
                    clock = clocks[index]
                    due = len(units) if clock <= 0 or elapsed >= clock else int(len(units) * elapsed / clock)
                    # Without a clock, a few words a chunk (vLLM sends one token a chunk, or a few).
                    due = min(due, sent[index] + WORDS_PER_CHUNK) if clock <= 0 else due
                    if self.stream_quirk == "one_event":
                        due = len(units) if clock <= 0 or elapsed >= clock else 0
                    for field_name, text in _runs(units[sent[index] : due]):
                        if self.stream_quirk == "so_far":
                            text = so_far[(index, field_name)] = so_far.get((index, field_name), "") + text
                        await send({"choices": [_delta(index, field_name, text, "messages" in payload)]})
                        if self.stream_quirk == "deep_event":
                            await response.write(b"data: " + b"[" * 5000 + b"]" * 5000 + b"\n\n")
                        if self.stream_quirk == "error_event":
                            await send({"error": {"message": "simulated failure", "code": 500}})
                            return response
                        if self.stream_quirk == "drop_mid" or self._once("drop_once"):
                            return _dropped(request, response)
                        if self.stream_quirk == "stall_mid":
                            await _keep_alive(response)
                    sent[index] = due
                    if due == len(units) and (clock <= 0 or elapsed >= clock):
                        ended[index] = True
                        ending = self._ending(body["choices"][index], "messages" in payload)
                        if self.stream_quirk == "so_far":  # the last chunk says the whole answer again
                            answer = "content" if "messages" in payload else "text"
                            text = so_far.get((index, answer), "")
                            ending.update({"delta": {"content": text}} if "messages" in payload else {"text": text})
                        await send({"choices": [ending]})
                await asyncio.sleep(_next_wake(pending, sent, ended, clocks, time.monotonic() - started))
            if self.stream_quirk == "drop_after_last":
                return _dropped(request, response)
            if (payload.get("stream_options") or {}).get("include_usage") and self.stream_quirk not in (
                "no_usage", "held_open",
            ):  # fmt: skip
                await send({"choices": [], "usage": body.get("usage")})
            if self.stream_quirk == "held_open":
                await _keep_alive(response)
            await response.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            # The tokens generated until the client left, as vLLM counts an aborted request's.
            elapsed = time.monotonic() - started
            done = sum(
                n if clock <= 0 else min(n, int(n * elapsed / clock)) for n, clock in zip(tokens, clocks, strict=True)
            )
            with self._lock:
                self.stats.tokens_generated += done
                self.stats.aborted += 1
            raise
        with self._lock:
            self.stats.tokens_generated += sum(tokens)
            self.stats.completed += 1
            self.stats.last_completed_at = time.time()
            self.stats.stopped += all(choice.get("finish_reason") == "stop" for choice in body["choices"])
        return response

    def _once(self, quirk: str) -> bool:
        """Whether this request is the one the ``..._once`` ``quirk`` happens to.

        It is when this server has that quirk and the request is the first to ask.
        """
        if self.stream_quirk != quirk:
            return False
        with self._lock:
            first = quirk not in self._done_once
            self._done_once.add(quirk)
        return first

    def _ending(self, choice: dict[str, Any], chat: bool) -> dict[str, Any]:
        ending: dict[str, Any] = {"index": choice["index"], "finish_reason": choice.get("finish_reason")}
        if "stop_reason" in choice:
            ending["stop_reason"] = choice["stop_reason"]
        ending.update({"delta": {}} if chat else {"text": ""})
        if self.stream_quirk == "unknown_field":
            ending["surprise"] = 1
        return ending

    def at_cap(self, prompt: str) -> bool:
        """Whether this server runs ``prompt`` to the cap (in mixed mode, by its hash or length)."""
        if self.mode != "mixed":
            return False
        if self.cap_min_chars is not None:
            return len(prompt) >= self.cap_min_chars
        return _at_cap(prompt, self.cap_fraction)

    def _first_answer(self, prompts: list[str], chat: bool) -> Any:
        """One of the first ``first_n`` answers: every choice ends with ``first_reason``."""
        if self.first_reason == "malformed":
            return self.malformed_body
        kind = "chat.completion" if chat else "text_completion"
        if self.first_reason == "no_choices":
            return {"id": "sim", "object": kind, "choices": [], "usage": {"completion_tokens": 0}}
        choices = [self._choice(i, self.first_reason, "", chat, 0) for i in range(len(prompts))]
        return {"id": "sim", "object": kind, "choices": choices, "usage": {"completion_tokens": 0}}

    def _choice(self, index: int, reason: str, text: str, chat: bool, tokens: int) -> dict[str, Any]:
        """One choice of an unstreamed response."""
        labelled = {} if self.stream_quirk == "unlabelled" else {"stop_reason": None}
        return {"index": index, "finish_reason": reason, **labelled, **self._body(text, chat, tokens)}

    def _shaped(self, prompt: str) -> bool:
        return self.shape is not None and _fraction("shape:" + prompt) < self.shape_fraction

    def _body(self, text: str, chat: bool, tokens: int) -> dict[str, Any]:
        """A choice's text (completions) or message (chat), as each mode's server sends it."""
        if chat and self.shape == "restated" and THINKING_ENDS in text:
            # A reasoning parser splits the thinking from the answer.
            thinking, _, answer = text.partition(THINKING_ENDS)
            return {"message": {"role": "assistant", "content": answer, self.reasoning_field: thinking}}
        if not chat:
            return {"text": "" if self.mode == "reasoning" else text}
        if self.mode == "reasoning" and text:
            empty = "" if self.stream_quirk == "unlabelled" else None  # vLLM: null after reasoning
            return {"message": {"role": "assistant", "content": empty, self.reasoning_field: text}}
        if self.lengths == "reasoning" and text and self.mode in ("healthy", "mixed"):
            # A thinking model's answer: the thinking (one word a token, words that never loop, or
            # the probe's loop detector would rightly flag it), then the answer.
            thinking = loop_text("random", f"{self.seed}:thinking:{text}:{tokens}", max(0, tokens - len(text.split())))
            return {"message": {"role": "assistant", "content": text, self.reasoning_field: thinking}}
        return {"message": {"role": "assistant", "content": text}}

    def _plan(self, prompt: str, max_tokens: int, turned: bool = False) -> tuple[str, int, str]:
        """(text, tokens, finish_reason) for one prompt (``turned``: past ``turn_after``); one
        token is one short word."""
        if turned or (self.cap_loop is not None and self.at_cap(prompt)):
            return loop_text(self.cap_loop or "loop_short", f"{self.seed}:{prompt}", max_tokens), max_tokens, "length"
        if self.loop_marker is not None and self.loop_marker in prompt:
            return self._rambling(prompt, max_tokens), max_tokens, "length"
        if self.mode == "window":
            tokens = max(1, max_tokens // 2)
            return self._rambling(prompt, tokens), tokens, "length"
        if self.mode == "empty":
            return "", 1, "stop"
        if self.mode == "hidden_cap":
            return self._rambling(prompt, max_tokens), max_tokens, "stop"
        if self.mode == "healthy" and self._shaped(prompt):
            text = shaped_answer(self.shape or "", prompt, healthy_answer(prompt))
            tokens = len(_WORDS.findall(text))
            return text, min(max_tokens, tokens), "stop" if tokens < max_tokens else "length"
        if self.mode == "healthy" or (self.mode == "mixed" and not self.at_cap(prompt)):
            answer = healthy_answer(prompt)
            tokens = answer_tokens(prompt, self.lengths, answer)
            # Only the token count follows the profile; the text stays the answer, so that
            # runs under every profile score alike. A planned length past the cap is cut there.
            return answer, min(max_tokens, tokens), "stop" if tokens < max_tokens else "length"
        if self.mode == "repetition":
            tokens = min(max_tokens, 64)
            # What the server's detector saw is not ours to repeat: the probe's would flag it first.
            return self._rambling(prompt, tokens), tokens, "repetition"
        if self.mode in LOOPS:
            return loop_text(self.mode, f"{self.seed}:{prompt}", max_tokens), max_tokens, "length"
        return self._rambling(prompt, max_tokens), max_tokens, "length"

    def _rambling(self, prompt: str, tokens: int) -> str:
        """The text of a generation that never stops and never loops: " and", then random words.

        Only the cap rule can catch it; the loop modes loop.
        """
        return " and" + loop_text("random", f"{self.seed}:{prompt}", tokens - 1) if tokens > 0 else ""

    async def _generate(self, duration_tokens: float, total_tokens: int) -> None:
        """Wait as long as the token clock says; count tokens even when aborted."""
        started = time.monotonic()
        try:
            if self.seconds_per_token > 0:
                await asyncio.sleep(duration_tokens * self.seconds_per_token)
        except asyncio.CancelledError:
            elapsed = time.monotonic() - started
            done = min(total_tokens, int(elapsed / self.seconds_per_token * total_tokens / max(duration_tokens, 1)))
            with self._lock:
                self.stats.tokens_generated += done
                self.stats.aborted += 1
            raise
        with self._lock:
            self.stats.tokens_generated += total_tokens
            self.stats.completed += 1
            self.stats.last_completed_at = time.time()

    def _loglikelihood(self, payload: dict[str, Any]) -> web.Response:
        """Echoed log-probabilities, one per prompt token (a token is a list item)."""
        with self._lock:
            self.stats.loglikelihood_requests += 1
        prompts = payload.get("prompt") or []
        if prompts and not isinstance(prompts[0], list):
            prompts = [prompts]
        choices = []
        for index, tokens in enumerate(prompts):
            logprobs = [None] + [-0.5] * len(tokens)
            top = [None] + [{"t": -0.5}] * len(tokens)
            choices.append(
                {
                    "index": index,
                    "text": "",
                    "logprobs": {"token_logprobs": logprobs, "top_logprobs": top},
                    "finish_reason": "length",
                }
            )
        return web.json_response({"id": "sim", "object": "text_completion", "choices": choices})


# The looping models' material: a paragraph of 60 words, and a vocabulary for random text.
_PARAGRAPH_TEXT = (
    "Let us compute the total step by step. First we add the apples to the oranges, then we "
    "subtract the ones that were eaten, and the remainder is what is left in the basket. So "
    "the number of fruits is the sum of the two counts minus the eaten ones, which gives us "
    "the answer we wanted to find here."
)
PARAGRAPH = _PARAGRAPH_TEXT.split(" ")
VOCABULARY = sorted({word.strip(".,").lower() for word in PARAGRAPH} | {f"w{i}" for i in range(2000)})


def shaped_answer(shape: str, prompt: str, answer: str) -> str:
    """A healthy answer of ``shape`` (SHAPES) to ``prompt``, ending with ``answer``."""
    n = int(_fraction("shape-n:" + prompt) * 1000)
    function = (
        f"def median_{n}(values):\n"
        '    """The median of the values that are not None."""\n'
        "    ordered = sorted(value for value in values if value is not None)\n"
        "    if not ordered:\n"
        '        raise ValueError("no values")\n'
        "    middle = len(ordered) // 2\n"
        "    if len(ordered) % 2:\n"
        "        return ordered[middle]\n"
        "    return (ordered[middle - 1] + ordered[middle]) / 2\n"
    )
    if shape == "restated":  # a reasoning model drafts a function, checks it, and gives it again
        thinking = f"Let me draft the function first.\n{function}Check: median_{n}([3, 1, None]) gives 2. Good.\n"
        return f"{thinking}{THINKING_ENDS}\nThe final code:\n{function}The answer is{answer}"
    if shape == "chorus":
        chorus = (
            "And we sing, oh we sing, under the northern light tonight,\n"
            "holding on, holding on, till the morning makes it right.\n"
        )
        verses = [f"Verse {i}: the river {n + i} knows the names of every town it passes by.\n" for i in (1, 2)]
        return f"{verses[0]}{chorus}{verses[1]}{chorus}Bridge: and so we count the miles.\n{chorus}Answer:{answer}"
    if shape == "json":
        records = ",\n".join(
            f'  {{"id": {n + i}, "type": "book", "status": "available", "tags": ["new", "sale"], "shelf": "A"}}'
            for i in range(16)
        )
        return f"[\n{records}\n]\nTotal:{answer}"
    rows = "".join(f"| shirt {n + i} | M | blue | yes |\n" for i in range(10))  # table
    return f"| item | size | color | stock |\n|---|---|---|---|\n{rows}Answer:{answer}"


def loop_text(mode: str, key: str, tokens: int) -> str:
    """``tokens`` words of a looping model's never-ending output (deterministic by ``key``)."""
    if mode == "loop_short":
        cycle = ["the", "answer", "is", "so"]
        return "".join(" " + cycle[i % len(cycle)] for i in range(tokens))
    draw = random.Random(key)
    if mode == "random":
        return "".join(" " + draw.choice(VOCABULARY) for _ in range(tokens))
    perturbed = 0.05 if mode == "loop_near" else 0.0
    words = [
        draw.choice(VOCABULARY) if perturbed and draw.random() < perturbed else PARAGRAPH[i % len(PARAGRAPH)]
        for i in range(tokens)
    ]
    return "".join(" " + word for word in words)


def _next_wake(
    pending: list[list[tuple[str, str]]], sent: list[int], ended: list[bool], clocks: list[float], elapsed: float
) -> float:
    """Seconds until the stream has something to send.

    That is the next word, or a choice's end, on time as unstreamed. At most one chunk goes per
    STREAM_TICK, so a fast clock is coalesced.
    """
    waits = []
    for units, done, over, clock in zip(pending, sent, ended, clocks, strict=True):
        if over:
            continue
        if clock <= 0:
            return 0.0
        if done < len(units):
            waits.append(max(clock * (done + 1) / len(units) - elapsed, STREAM_TICK))
        else:
            waits.append(max(clock - elapsed, 0.0))
    return min(waits, default=0.0)


async def _cut_short(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """``body`` as JSON that promises 50 bytes more than it sends, then the connection dropped."""
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "Content-Length": str(len(data) + 50)}
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    await response.write(data)
    return _dropped(request, response)


def _dropped(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """``response`` with its connection dropped where it stands: the client's body is cut short."""
    if request.transport is not None:
        request.transport.close()
    return response


async def _keep_alive(response: web.StreamResponse) -> None:
    """A keep-alive comment every 0.5 s, never [DONE]: until the client leaves."""
    while True:
        await response.write(b": keep-alive\n\n")
        await asyncio.sleep(0.5)


def _is_response(body: Any) -> bool:
    return (
        isinstance(body, dict)
        and body.get("object") in ("text_completion", "chat.completion")
        and isinstance(body.get("choices"), list)
    )


def _units(choice: dict[str, Any]) -> list[tuple[str, str]]:
    """A choice's output as (field, word) units in the order a server generates them."""
    if "message" not in choice:
        return [("text", word) for word in _WORDS.findall(choice.get("text") or "")]
    message = choice["message"]
    units = []
    for name in ("reasoning_content", "reasoning", "content"):
        units += [(name, word) for word in _WORDS.findall(message.get(name) or "")]
    return units


def _runs(units: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Consecutive units of one field joined: one delta each."""
    runs: list[tuple[str, str]] = []
    for name, word in units:
        if runs and runs[-1][0] == name:
            runs[-1] = (name, runs[-1][1] + word)
        else:
            runs.append((name, word))
    return runs


def _delta(index: int, name: str, text: str, chat: bool) -> dict[str, Any]:
    if chat:
        return {"index": index, "delta": {name: text}, "finish_reason": None}
    return {"index": index, "text": text, "finish_reason": None}
