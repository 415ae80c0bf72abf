"""`eval-probe demo` and the counters it shows, against servers that answer garbage: a reason, never
a traceback, and never a made-up count."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Callable, Iterator

import pytest
from support.procs import PYTHON

from probe import exitcodes
from probe.demo.servercounters import server_counters

# Does not depend on the lm-eval release.
pytestmark = pytest.mark.release_independent


def http(body: bytes, status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body


NOT_HTTP = b"\x00\xffNOT HTTP AT ALL\r\n\r\n"
LONG_HEADER = b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000 + b"\r\n\r\n"


@pytest.fixture
def raw_server() -> Iterator[Callable[[Callable[[bytes], bytes]], str]]:
    """A server on 127.0.0.1 answering each request with ``answer(request path)``, raw bytes."""
    sockets: list[socket.socket] = []

    def start(answer: Callable[[bytes], bytes]) -> str:
        listener = socket.create_server(("127.0.0.1", 0))
        sockets.append(listener)

        def serve() -> None:
            while True:
                try:
                    connection, _ = listener.accept()
                except OSError:
                    return
                with connection:
                    request = connection.recv(65536)
                    path = request.split(b" ")[1] if request.count(b" ") >= 2 else b""
                    connection.sendall(answer(path))

        threading.Thread(target=serve, daemon=True).start()
        return f"http://127.0.0.1:{listener.getsockname()[1]}"

    yield start
    for listener in sockets:
        listener.close()


@pytest.mark.parametrize("answer", [NOT_HTTP, LONG_HEADER], ids=["not-http", "header-too-long"])
def test_demo_says_a_server_that_does_not_speak_http_cannot_be_used(raw_server, answer: bytes) -> None:
    # Before: http.client.BadStatusLine / LineTooLong escaped as a traceback, exit 70.
    url = raw_server(lambda _path: answer)
    run = subprocess.run([PYTHON, "-m", "probe", "demo", "--base-url", url, "--model", "m"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == exitcodes.DEMO_CANNOT_RUN, run.stderr[-2000:]
    assert f"cannot reach the server at {url}" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize(
    "metrics",
    [
        b"vllm:request_success_total 3\n",  # no finished_reason label
        b'vllm:generation_tokens_total{x="1"} NaN\n',  # not a count
        b'vllm:generation_tokens_total{x="1"} many\n',
        b"sglang:generation_tokens_total 5\n",  # another server's metrics: no vLLM count at all
        NOT_HTTP,
        LONG_HEADER,
    ],
    ids=["no-reason", "nan", "word", "not-vllm", "not-http", "header-too-long"],
)
def test_counters_from_garbage_are_unknown_not_a_crash_or_zero(raw_server, metrics: bytes) -> None:
    # Before: IndexError / ValueError / BadStatusLine escaped (the demo died with exit 70), and
    # another server's /metrics read as "0 tokens generated".
    def answer(path: bytes) -> bytes:
        if metrics in (NOT_HTTP, LONG_HEADER):
            return metrics  # whatever is asked
        return http(metrics) if path == b"/metrics" else http(b"", b"404 Not Found")

    url = raw_server(answer)
    assert server_counters(url) == (None, None)


@pytest.mark.parametrize("stats", [b'{"generate_requests": "7", "tokens_generated": 3}', b"[1, 2]", b"\xff"])
def test_stats_that_are_not_counts_are_unknown(raw_server, stats: bytes) -> None:
    url = raw_server(lambda path: http(stats) if path == b"/stats" else http(b"", b"404 Not Found"))
    assert server_counters(url) == (None, None)
