"""``eval-probe demo``: the same evaluation of a never-stopping model, unprobed and probed.

It needs no GPU and no download. A simulated server runs in-process, or ``--base-url`` points at a
real one. lm-eval evaluates a bundled local task. The two runs are compared side by side, then the
reader gives its verdict. See docs/cli.md.
"""

from __future__ import annotations

import http.client
import importlib.util
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from patcher.install import install
from probe import exitcodes
from probe.demo.localtask import offline_env, write_task
from probe.demo.servercounters import UNREADABLE, server_counters
from probe.demo.simserver import SimServer
from probe.inject import payload
from probe.reader.render import describe
from probe.reader.verdict import classify
from probe.terminal import fit

# One full-length simulated generation takes max_tokens x this: 4096 tokens in ~8 s.
SECONDS_PER_TOKEN = 0.002


@dataclass
class RunFigures:
    requests: int | None
    tokens: int | None
    wall_s: float
    exit_code: int
    score: float | None


Counters = tuple[int | None, int | None]


def _counters(server: SimServer | None, base_url: str) -> Counters:
    """(generate requests, generated tokens) so far, from the in-process simulated server
    or from what the server at ``base_url`` exposes."""
    if server is None:
        return server_counters(base_url)
    stats = server.snapshot()
    return stats["generate_requests"], stats["tokens_generated"]


def since(before: Counters, now: Counters) -> Counters:
    """What the server counted between ``before`` and ``now``, or None where either is missing.

    These are one run's own figures, never those of the runs before it.
    """
    return tuple(None if b is None or n is None else n - b for b, n in zip(before, now, strict=True))  # type: ignore[return-value]


def unreachable(base_url: str, timeout: float = 10) -> str | None:
    """Why nothing answers HTTP at ``base_url``, or None when something does.

    Any status counts: a 404 for ``/v1/models`` still means a server is there.
    """
    try:
        with urllib.request.urlopen(f"{base_url.rstrip('/')}/v1/models", timeout=timeout):
            return None
    except urllib.error.HTTPError:
        return None
    except http.client.HTTPException as error:  # BadStatusLine, LineTooLong: something answers, not HTTP
        return f"it does not answer HTTP: {type(error).__name__}"
    except (*UNREADABLE, ValueError) as error:  # URLError, refused, timed out, not HTTP; ValueError: not a URL
        return str(getattr(error, "reason", None) or error) or type(error).__name__


def _timed(label: str, log: Path, run: Callable[[], int], counters: Callable[[], Counters]) -> tuple[int, float]:
    """Run ``run`` while showing elapsed time and the server's counters on one line."""
    done = threading.Event()
    started = time.monotonic()

    def progress() -> None:
        while not done.wait(1.0):
            requests, tokens = ("n/a" if c is None else c for c in counters())
            print(f"\r  {label}: {time.monotonic() - started:5.0f} s, server: {requests} requests, "
                  f"{tokens} tokens   ", end="", file=sys.stderr, flush=True)  # fmt: skip

    ticker = threading.Thread(target=progress, daemon=True)
    ticker.start()
    try:
        code = run()
    finally:
        done.set()
        ticker.join()
    wall = time.monotonic() - started
    print(f"\r  {label}: done in {wall:.1f} s (exit {code}; lm-eval log: {log})" + " " * 20, file=sys.stderr)
    return code, wall


def demo(base_url: str | None, model: str | None, docs: int, max_tokens: int, concurrency: int) -> int:
    """Run the comparison and return its exit code.

    It is 0 when both runs finished and the probe tripped, else DEMO_NOT_TRIPPED. It is
    DEMO_CANNOT_RUN, after saying why, when lm-eval is missing or ``base_url`` is unreachable.
    """
    if importlib.util.find_spec("lm_eval") is None:
        print(f"eval-probe demo: lm-eval is not installed for {sys.executable}; install it beside eval-probe "
              "(pip install 'lm-eval-probe[lm-eval]')", file=sys.stderr)  # fmt: skip
        return exitcodes.DEMO_CANNOT_RUN
    if base_url is not None and (why := unreachable(base_url)) is not None:
        print(f"eval-probe demo: cannot reach the server at {base_url} ({why})", file=sys.stderr)
        return exitcodes.DEMO_CANNOT_RUN
    work = Path(tempfile.mkdtemp(prefix="eval-probe-demo-"))
    task = write_task(work / "task", docs)
    server = None
    if base_url is None:
        server = SimServer("never_stop", seconds_per_token=SECONDS_PER_TOKEN).start()
        base_url, model = server.base_url, "sim-never-stop"
        print(f"simulated never-stopping model at {base_url} (one full generation: "
              f"{max_tokens * SECONDS_PER_TOKEN:.0f} s)", file=sys.stderr)  # fmt: skip
    site = work / "site"
    install(site, payload())
    print(f"task: {docs} documents, max_tokens={max_tokens}, num_concurrent={concurrency}; work dir {work}",
          file=sys.stderr)  # fmt: skip
    figures: dict[str, RunFigures] = {}
    try:
        for label, probed in (("unprobed", False), ("probed", True)):
            output = work / label
            env = offline_env(site, HYPERLOOM_EVAL_PROBE="1" if probed else "0", RESULT_DIR=str(output))
            command = task.lm_eval_command(base_url, model, output, max_tokens, concurrency, model_args="max_retries=3")
            log = work / f"{label}.log"
            before = _counters(server, base_url)

            def call(command: list[str] = command, env: dict = env, log: Path = log) -> int:
                with log.open("w") as handle:
                    return subprocess.call(command, env=env, stdout=handle, stderr=subprocess.STDOUT)

            def counted(before: Counters = before) -> Counters:
                return since(before, _counters(server, base_url))

            code, wall = _timed(label, log, call, counted)
            delta = counted()
            verdict = classify(output, floor=0.01)
            figures[label] = RunFigures(delta[0], delta[1], wall, code, verdict.score)
            if probed:
                print(_table(figures))
                print("\nthe reader's verdict on the probed run (eval-probe read " + str(output) + "):")
                print(fit(describe(verdict)))
                return 0 if code == 0 and verdict.was_cut_short else exitcodes.DEMO_NOT_TRIPPED
    finally:
        if server is not None:
            server.stop()
    return exitcodes.DEMO_NOT_TRIPPED


def _table(figures: dict[str, RunFigures]) -> str:
    def cell(value: object) -> str:
        return "n/a" if value is None else f"{value:,}" if isinstance(value, int) else f"{value}"

    rows = [("", "requests sent", "tokens generated", "wall time", "score", "exit")]
    for label, f in figures.items():
        rows.append((label, cell(f.requests), cell(f.tokens), f"{f.wall_s:.1f} s", cell(f.score), str(f.exit_code)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    plain, probed = figures.get("unprobed"), figures.get("probed")
    if plain and probed and plain.tokens and probed.tokens is not None:
        lines.append(f"\nthe probe saved {1 - probed.tokens / plain.tokens:.0%} of the generated tokens and "
                     f"{plain.wall_s - probed.wall_s:.0f} s of wall time")  # fmt: skip
    return "\n" + "\n".join(lines)
