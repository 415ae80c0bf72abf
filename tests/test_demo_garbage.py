"""`eval-probe demo` and the counters it shows, against servers that answer garbage: a reason, never
a traceback, and never a made-up count."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from support.procs import PYTHON

from probe import exitcodes
from probe.demo.localtask import offline_env
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


def test_ctrl_c_during_the_demo_ends_it_quietly_with_130(tmp_path) -> None:
    # Ctrl-C reaches the demo and the lm-eval it runs (one process group, as at a terminal).
    # Before: a KeyboardInterrupt traceback from subprocess's wait.
    proc = subprocess.Popen(
        [PYTHON, "-m", "probe", "demo", "--docs", "8", "--max-tokens", "1024"],
        env=offline_env(None, TMPDIR=str(tmp_path)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        for line in iter(proc.stderr.readline, ""):  # "" at the end: the demo ended first (then fail below)
            if "task:" in line:
                break
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    assert "Traceback" not in err and "interrupted" in err
