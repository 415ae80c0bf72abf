"""scripts/vllm_server.py's start-up, with a stand-in for vLLM's entry point (a real
subprocess and real HTTP): a port taken while vLLM starts is retried on another, and whatever
else answers on the port never passes for the server."""

from __future__ import annotations

import http.server
import json
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.vllm import SCRIPTS

sys.path.insert(0, str(SCRIPTS))
import vllm_server

# Run as "python -m vllm.entrypoints.openai.api_server ... --port P --served-model-name N":
# fails to bind a port listed in TAKEN as vLLM does (after a while), else serves /v1/models.
STAND_IN = textwrap.dedent(
    """\
    #!{python}
    import http.server, json, os, sys, time
    args = sys.argv[1:]
    port, name = int(args[args.index("--port") + 1]), args[args.index("--served-model-name") + 1]
    if str(port) in os.environ["TAKEN"].split(","):
        time.sleep(3)
        print("OSError: [Errno 98] Address already in use", flush=True)
        sys.exit(1)
    class Models(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({{"object": "list", "data": [{{"id": name}}]}}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
    http.server.HTTPServer(("127.0.0.1", port), Models).serve_forever()
    """
)


class _Other(http.server.BaseHTTPRequestHandler):
    """Another server on the port: healthy, serving another model."""

    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "someone-else"}]}).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other() -> Iterator[int]:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture
def stand_in(tmp_path: Path) -> str:
    path = tmp_path / "python"
    path.write_text(STAND_IN.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def test_a_port_taken_during_start_up_is_retried_on_another_and_no_other_server_passes(
    stand_in, other, tmp_path, monkeypatch
) -> None:
    # The first free port is taken by another healthy server before "vLLM" binds it: answering
    # /health there must not pass for the start, and the next port is tried.
    monkeypatch.setenv("TAKEN", str(other))
    ports, free_port = iter([other]), vllm_server.free_port
    monkeypatch.setattr(vllm_server, "free_port", lambda: next(ports, None) or free_port())
    server = vllm_server.start(tmp_path, "tiny", stand_in, log=tmp_path / "log", timeout=30)
    try:
        assert server.base_url != f"http://127.0.0.1:{other}"
    finally:
        vllm_server.stop(server.pid)


def test_a_port_asked_for_and_taken_is_an_error_that_says_so(stand_in, other, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TAKEN", str(other))
    with pytest.raises(vllm_server.PortTaken, match=f"port {other} was taken"):
        vllm_server.start(tmp_path, "tiny", stand_in, port=other, log=tmp_path / "log", timeout=30)
