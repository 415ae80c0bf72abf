"""A simulated OpenAI-compatible server for tests, the demo and the benchmarks.

Serves ``/v1/completions`` and ``/v1/chat/completions`` on 127.0.0.1 (aiohttp) and
behaves like a chosen kind of model:

- ``never_stop``: every generation runs to ``max_tokens`` (``finish_reason: length``);
- ``healthy``: answers the last ``a + b`` in the prompt (``stop``), in as many tokens as
  its length profile says: ``short`` (a few), ``lognormal`` (around 300, as chat answers
  vary) or ``reasoning`` (around 3,000, as a thinking model's do), fixed per prompt;
- ``mixed``: a chosen fraction of prompts (picked by a hash of the prompt) runs to the cap;
  with ``cap_min_chars``, the prompts at least that long do instead (cap-hitting that
  follows prompt length, as lm-eval sends the longest first);
- ``repetition``: vLLM's repetition detector ends every generation (``repetition``);
- ``window``: every generation hits the context window (``length`` below ``max_tokens``);
- ``hidden_cap``: every generation runs to ``max_tokens`` but is reported as ``stop`` (a
  server that hides the cap; ``usage.completion_tokens`` still tells);
- ``reasoning``: every generation spends the budget reasoning (``length``; chat content
  null, ``reasoning_content`` set; completions text empty);
- ``empty``: the model stops at once with nothing to say (``stop``, empty or null content);
- ``malformed``: well-formed HTTP, nonsense JSON bodies.

``loop_marker``: prompts that contain it never stop, whatever the mode (two tasks, one
broken, against one server). ``first_n`` and ``first_reason``: the first ``first_n`` generate
requests are answered with that ``finish_reason`` instead (``"error"``, ``"timeout"``, any
string), with no choices at all (``"no_choices"``) or with a nonsense body (``"malformed"``),
whatever the mode.

A token clock (seconds per generated token) makes generations take time; when a client
drops a request, the tokens generated so far are counted and the request is counted
as aborted, as vLLM does. ``GET /stats`` returns the counters, including how many generate
requests were in flight when each one arrived.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

MODES = ("never_stop", "healthy", "mixed", "repetition", "window", "hidden_cap", "reasoning", "empty", "malformed")
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
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
        if lengths not in LENGTHS:
            raise ValueError(f"unknown length profile {lengths!r}; choose one of {', '.join(LENGTHS)}")
        self.lengths = lengths
        self.mode = mode
        self.seconds_per_token = seconds_per_token
        self.cap_fraction = cap_fraction
        self.malformed_body = malformed_body if malformed_body is not None else {"choices": "nonsense"}
        self.port = port
        self.jitter = jitter
        self.loop_marker = loop_marker
        self.cap_min_chars = cap_min_chars
        self.first_n = first_n
        self.first_reason = first_reason
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

    async def _completions(self, request: web.Request) -> web.Response:
        payload = await request.json()
        chat = request.path.endswith("/chat/completions")
        if not payload.get("max_tokens", payload.get("max_completion_tokens")) or payload.get("echo"):
            return self._loglikelihood(payload)
        max_tokens = int(payload.get("max_tokens", payload.get("max_completion_tokens")))
        prompts = _prompt_text(payload)
        with self._lock:
            self.stats.generate_requests += 1
            self.stats.generate_request_times.append(time.time())
            first = self.stats.generate_requests <= self.first_n
        if first:
            return self._first_answer(prompts, chat)
        if self.mode == "malformed":
            return web.json_response(self.malformed_body)
        plans = [self._plan(prompt, max_tokens) for prompt in prompts]
        longest = max(tokens for _, tokens, _ in plans)
        # Jitter stretches each request's clock by up to that fraction, so that requests
        # started together do not all end in the same instant.
        stretch = 1.0 + self.jitter * _fraction(prompts[0])
        with self._lock:
            self.stats.in_flight += 1
            self.stats.in_flight_at_arrival.append(self.stats.in_flight)
            self.stats.stopped_at_arrival.append(self.stats.stopped)
        try:
            await self._generate(longest * stretch, sum(tokens for _, tokens, _ in plans))
        finally:
            with self._lock:
                self.stats.in_flight -= 1
        with self._lock:
            self.stats.stopped += all(reason == "stop" for _, _, reason in plans)
        choices = []
        for index, (text, _tokens, reason) in enumerate(plans):
            choices.append({"index": index, "finish_reason": reason, **self._body(text, chat)})
        usage = {"completion_tokens": sum(t for _, t, _ in plans), "prompt_tokens": 1}
        kind = "chat.completion" if chat else "text_completion"
        return web.json_response(
            {"id": "sim", "object": kind, "model": payload.get("model"), "choices": choices, "usage": usage}
        )

    def at_cap(self, prompt: str) -> bool:
        """Whether this server runs ``prompt`` to the cap (in mixed mode, by its hash or length)."""
        if self.mode != "mixed":
            return False
        if self.cap_min_chars is not None:
            return len(prompt) >= self.cap_min_chars
        return _at_cap(prompt, self.cap_fraction)

    def _first_answer(self, prompts: list[str], chat: bool) -> web.Response:
        """One of the first ``first_n`` answers: every choice ends with ``first_reason``."""
        if self.first_reason == "malformed":
            return web.json_response(self.malformed_body)
        if self.first_reason == "no_choices":
            return web.json_response({"id": "sim", "choices": [], "usage": {"completion_tokens": 0}})
        choices = [
            {"index": i, "finish_reason": self.first_reason, **self._body("", chat)} for i in range(len(prompts))
        ]
        return web.json_response({"id": "sim", "choices": choices, "usage": {"completion_tokens": 0}})

    def _body(self, text: str, chat: bool) -> dict[str, Any]:
        """A choice's text (completions) or message (chat), as each mode's server sends it."""
        if not chat:
            return {"text": "" if self.mode == "reasoning" else text}
        if self.mode == "reasoning" and text:
            return {"message": {"role": "assistant", "content": None, "reasoning_content": text}}
        return {"message": {"role": "assistant", "content": text or None}}

    def _plan(self, prompt: str, max_tokens: int) -> tuple[str, int, str]:
        """(text, tokens, finish_reason) for one prompt; one token is one short word."""
        if self.loop_marker is not None and self.loop_marker in prompt:
            return " and" * max_tokens, max_tokens, "length"
        if self.mode == "window":
            tokens = max(1, max_tokens // 2)
            return " and" * tokens, tokens, "length"
        if self.mode == "empty":
            return "", 1, "stop"
        if self.mode == "hidden_cap":
            return " and" * max_tokens, max_tokens, "stop"
        if self.mode == "healthy" or (self.mode == "mixed" and not self.at_cap(prompt)):
            answer = healthy_answer(prompt)
            tokens = answer_tokens(prompt, self.lengths, answer)
            # Only the token count follows the profile; the text stays the answer, so that
            # runs under every profile score alike. A planned length past the cap is cut there.
            return answer, min(max_tokens, tokens), "stop" if tokens < max_tokens else "length"
        if self.mode == "repetition":
            tokens = min(max_tokens, 64)
            return " again" * tokens, tokens, "repetition"
        return " and" * max_tokens, max_tokens, "length"

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
