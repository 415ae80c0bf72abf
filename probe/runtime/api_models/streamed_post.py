"""The aiohttp glue of streamed evidence: a stand-in for lm-eval's session whose ``post`` streams.

lm-eval's own ``amodel_call`` runs unchanged: its payload, retries, error handling, parser and cache.
For a payload that may stream, ``post`` feeds each choice's new text to the probe as it arrives.
lm-eval then gets a response whose ``json()`` is the reassembled unstreamed body.
What cannot be reassembled with certainty is sent again as one ordinary request, said once.
lm-eval gets that response untouched. A server that ignores ``stream`` is not asked twice.
See docs/api.md.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from probe.runtime.core.contract import ENV_STREAM
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
from probe.runtime.scope.groups import Request


class Reassembled:
    """What lm-eval's ``amodel_call`` reads of a response, for a reassembled stream."""

    ok = True
    status = 200

    def __init__(self, body: dict[str, Any]) -> None:
        self._body = body

    async def json(self, **_: Any) -> dict[str, Any]:
        return self._body

    async def text(self, **_: Any) -> str:
        return json.dumps(self._body)

    def raise_for_status(self) -> None:
        return None


class AnsweredUnstreamed(Reassembled):
    """The unstreamed response a server sent though asked to stream, as it came."""


class StreamingSession:
    """Stands in for lm-eval's aiohttp session during one generate call; everything but
    ``post`` of a streamable payload goes to the session itself."""

    def __init__(self, session: Any, probe: Any, request: Request, mode: str) -> None:
        self._session = session
        self._probe = probe
        self._request = request
        self._mode = mode

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)

    def post(self, url: Any, *args: Any, json: Any = None, **kwargs: Any) -> Any:
        n_choices = streamable(json) if not args else None
        if n_choices is None or (self._mode == "auto" and str(url) in self._probe.not_streamed):
            return self._session.post(url, *args, json=json, **kwargs)
        return _StreamedPost(self, url, json, kwargs, n_choices)


class _StreamedPost:
    """``async with session.post(...) as response``, streamed, with the ordinary request as fallback."""

    def __init__(self, owner: StreamingSession, url: Any, payload: dict, kwargs: dict, n_choices: int) -> None:
        self._owner = owner
        self._url = url
        self._payload = payload
        self._kwargs = kwargs
        self._n_choices = n_choices
        self._ordinary: Any = None
        self._status: int | None = None  # the streamed attempt's HTTP status
        # Whether to stream to this server no more, when the streamed attempt decided it (a
        # stream that broke off or stalled, an uncertain answer); None: the ordinary request's
        # outcome decides.
        self._stop: bool | None = None

    async def __aenter__(self) -> Any:
        owner = self._owner
        outcome = await self._stream()
        if isinstance(outcome, AnsweredUnstreamed):
            answered = f"{self._url} answered a streamed request unstreamed (it ignores stream); its answer is used"
            answered += " as it came"
            self._settle("unstreamed", answered, "", stop=True)
            return outcome
        if isinstance(outcome, Reassembled):
            return outcome
        _end_if_tripped(owner._request)  # tripped while this one streamed: nothing more is sent for it
        reason = outcome.split(":")[0]
        failed = f"a streamed request to {self._url} could not be reassembled ({outcome}); sent it unstreamed"
        if self._stop is not None:
            # Said (and streaming stopped) before the ordinary request: a server that fails that
            # too (down, restarting) then asks no further question.
            self._settle(reason, failed, ", each request tries again", self._stop)
        self._ordinary = owner._session.post(self._url, json=self._payload, **self._kwargs)
        response = await self._ordinary.__aenter__()
        if self._stop is None:
            # A server that cannot stream answered the ordinary request; one that was briefly
            # overloaded or failing (408, 429, 5xx) may stream the next one.
            self._settle(
                reason, failed, ", each request tries again", response.ok and not passing_failure(self._status)
            )
        return response

    def _settle(self, reason: str, said: str, under_on: str, stop: bool) -> None:
        """Say once per server and ``reason`` what happened (``said``, then what comes next);
        under ``auto``, with ``stop``, stream to this server no more."""
        mode = self._owner._mode
        if mode == "auto" and stop:
            self._owner._probe.not_streamed.add(str(self._url))
        then = ", not streaming to it again" if mode == "auto" and stop else under_on
        self._owner._probe.errors.once(f"stream:{self._url}:{reason}", f"{said}{then} ({ENV_STREAM}={mode})")

    async def __aexit__(self, *exc: Any) -> Any:
        if self._ordinary is not None:
            return await self._ordinary.__aexit__(*exc)
        return False

    async def _stream(self) -> Reassembled | str:
        """The reassembled response (or the unstreamed one the server sent instead), or why there is none."""
        owner = self._owner
        async with owner._session.post(self._url, json=streamed(self._payload), **self._kwargs) as response:
            complete = False
            self._status = response.status
            try:
                if not response.ok:
                    return f"status {response.status}"
                if "text/event-stream" not in response.headers.get("Content-Type", "").lower():
                    answer = await _json_answer(response, self._n_choices)
                    complete = answer is not None
                    return answer or "a reply that is not a stream"
                began = time.monotonic()
                try:
                    body = await self._read(response)
                except (asyncio.TimeoutError, _aiohttp("ClientError", asyncio.TimeoutError)) as error:
                    first = self._owner._probe.broken_since.setdefault(str(self._url), time.monotonic())
                    # A stall costs a timeout each time; a break, only once it recurs.
                    self._stop = isinstance(error, asyncio.TimeoutError) or began > first
                    return f"a stream that broke off or stalled: {type(error).__name__}: {str(error)[:200]}"
                self._owner._probe.broken_since.pop(str(self._url), None)
                complete = True
                return body
            except Unassemblable as error:
                if isinstance(error, UncertainAnswer):
                    self._stop = False  # the answer was uncertain, not the stream: the next one streams
                return str(error)
            finally:
                # Closing, not releasing, drops the connection: the server aborts the generation.
                if not complete:
                    response.close()

    async def _read(self, response: Any) -> Reassembled:
        lines, whole = EventLines(), Reassembly(self._n_choices)
        request, probe = self._owner._request, self._owner._probe
        # Pieces, not lines: aiohttp refuses a line over twice its read buffer (512 KiB), and a
        # server may send a whole long answer as one event.
        try:
            async for chunk in response.content.iter_any():
                for data in _refusing(lines.feed_chunk, chunk):
                    for index, text in _refusing(whole.add_event, data):
                        probe.partial(request, index, text, whole.answering(index))
                    # Its group tripped (perhaps on this very text): end it as a trip ends the others.
                    _end_if_tripped(request)
                if whole.done:
                    break
        except asyncio.TimeoutError:
            if not whole.ended:  # a generation still running, or a stream stalled: the caller falls back
                raise
            # Every choice had ended, and the server held the stream open until the timeout.
            raise Unassemblable("a stream held open after its choices ended, without [DONE]") from None
        for data in _refusing(lines.flush):
            _refusing(whole.add_event, data)
        return Reassembled(_refusing(whole.response))


def _refusing(step: Any, *arguments: Any) -> Any:
    """``step(*arguments)``, one step of the reassembly, whose every failure is a refusal.

    A defect of the reassembly must not escape into lm-eval, which would retry the stream until the run died.
    The ordinary request decides instead.
    """
    try:
        return step(*arguments)
    except Unassemblable:
        raise
    except Exception as error:
        raise Unassemblable(f"the reassembly failed ({type(error).__name__}: {str(error)[:200]})") from error


def _end_if_tripped(request: Request) -> None:
    """End ``request``'s call as a trip ends the calls in flight, if its group has tripped."""
    if request.group.tripped:
        request.cancelled_by_probe = True
        raise asyncio.CancelledError


def _aiohttp(name: str, fallback: type[BaseException]) -> type[BaseException]:
    """aiohttp's exception ``name`` (``fallback`` if aiohttp is not imported): aiohttp is
    lm-eval's, imported by the time a response exists; the runtime imports none of its own."""
    return getattr(sys.modules.get("aiohttp"), name, fallback)


async def _json_answer(response: Any, n_choices: int) -> AnsweredUnstreamed | None:
    """The unstreamed response in a non-stream reply to a streamed request, or None when it is not one.

    It is read as lm-eval reads a response: aiohttp's ``json()``, with its content-type check,
    the charset the header names, and no byte-order mark.
    On None, the ordinary request that follows gets lm-eval whatever it would have got, errors included.
    """
    # aiohttp's ContentTypeError is "not JSON", as a decode error is, and so is JSON nested past
    # Python's stack (RecursionError). A timeout or a connection lost while the body is read
    # propagates, as it would unstreamed.
    not_json = (ValueError, RecursionError, _aiohttp("ContentTypeError", ValueError))
    try:
        body = await response.json()
    except not_json:
        return None
    return AnsweredUnstreamed(body) if unstreamed_answer(body, n_choices) else None
