"""A pass-through HTTP proxy that records when each generate request arrived and ended.

vLLM's /metrics count requests but do not say when they came; the verdict benchmark
needs "requests received after the trip", the healthy benchmark the generation span (the
first generate request to the last answer). A reply is passed on as it arrives (a stream piece by piece: a
proxy that read it whole would hand the probe every streamed token at the end). A client that
drops its request makes the proxy drop the upstream one, so vLLM still aborts it.
"""

from __future__ import annotations

import asyncio
import threading
import time

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web


class CountingProxy:
    """Forwards every request to ``upstream``; ``times`` holds generate-request arrivals,
    ``streamed`` how many of them asked for a stream, ``last_completed_at`` when a generate reply
    was last passed on whole (``time.time()``)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.times: list[float] = []
        self.streamed = 0
        self.last_completed_at = 0.0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CountingProxy:
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self._start())
            ready.set()
            self._loop.run_forever()

        threading.Thread(target=serve, daemon=True).start()
        ready.wait(30)
        return self

    async def _start(self) -> None:
        # No keep-alive upstream: a pooled connection the server has since closed would
        # fail a request that lm-eval then retries, and the retry would be counted too.
        self._session = ClientSession(timeout=ClientTimeout(total=3600), connector=TCPConnector(force_close=True))
        app = web.Application(client_max_size=64 * 1024**2)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        generate = request.method == "POST" and b'"max_tokens"' in body and b'"echo"' not in body
        if generate:
            self.times.append(time.time())
            self.streamed += b'"stream": true' in body
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body, headers={"Content-Type": "application/json"}
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            await response.prepare(request)
            try:
                async for piece in upstream.content.iter_any():
                    await response.write(piece)
                await response.write_eof()
                if generate:
                    self.last_completed_at = time.time()
            except ConnectionResetError:  # the client left: leaving here drops the upstream request too
                pass
        return response

    def stop(self) -> None:
        async def close() -> None:
            await self._session.close()
            await self._runner.cleanup()  # type: ignore[union-attr]

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
