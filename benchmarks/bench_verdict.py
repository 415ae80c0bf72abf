"""Time and tokens to the verdict: a never-stopping model, unprobed and probed, in one run.

Three lm-eval runs: unprobed; probed with the default settings (the slow start on, as
``auto`` decides at this concurrency; requests streamed, as ``HYPERLOOM_EVAL_PROBE_STREAM=auto``
decides); probed with ``HYPERLOOM_EVAL_PROBE_SLOW_START=off`` (a whole first wave, for
comparison). On the simulated server, then one probed run per looping never-stopping model
(``--loops``: a short exact cycle, a paragraph-long cycle, a near-loop, random text), where the
degeneration detector should trip long before any generation reaches the cap (and random text,
which does not loop, by the cap rule). For each it measures the tokens the server generated
(the simulated server's counter, or vLLM's ``vllm:generation_tokens_total``, both counting
the partial tokens of aborted requests), the generate requests it received, and the wall
time until lm-eval exits; for the probed runs also the time from the first request to the
trip, from the trip to lm-eval's exit, and the generate requests received after the trip.
Measured first, straight against the server: one wave of MIN_SAMPLES concurrent
full-length generations (what the slow start sends: the time one full-length generation
takes there) and one wave of C; before each looping model's run, how long the server takes
to let in MIN_SAMPLES streamed requests sent at once (its own serial cost: the simulated
server makes each request's whole answer as it arrives), beside how long the probed run's
first MIN_SAMPLES took to arrive. ``--runs`` and ``--loops`` choose the runs; ``--seconds-per-token``
sets the simulated clock (a real large model takes tens of milliseconds a token).

    python benchmarks/bench_verdict.py --server sim   # N=1319, C=64, M=16384, 0.25 ms/token
    python benchmarks/bench_verdict.py --server vllm --vllm-python .venv-vllm/bin/python
                                                      # N=200, C=64, M=1024, a tiny Llama

The last line printed with --json is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from probe.demo.localtask import write_task  # noqa: E402
from probe.demo.servercounters import vllm_metrics  # noqa: E402
from probe.demo.simserver import LOOPS, SimServer  # noqa: E402
from probe.reader.sidecar import read_sidecar  # noqa: E402
from probe.reader.verdict import classify  # noqa: E402
from probe.runtime.core.contract import ENV_SLOW_START, Settings  # noqa: E402

DEFAULTS = {"sim": (1319, 64, 16384), "vllm": (200, 64, 1024)}
# The never-stopping model's runs: the slow start's knob for each (None: unprobed).
RUNS: dict[str, str | None] = {"unprobed": None, "probed": "auto", "probed_slow_start_off": "off"}


class Target:
    """The server under test, with its counters and request arrival times."""

    def __init__(self, kind: str, args: argparse.Namespace, work: Path, mode: str = "never_stop") -> None:
        self.kind = kind
        if kind == "sim":
            self.sim = SimServer(mode, seconds_per_token=args.seconds_per_token).start()
            self.base_url, self.model = self.sim.base_url, f"sim-{mode}"
        else:
            import vllm_server
            from countingproxy import CountingProxy

            model = work / args.vllm_model
            subprocess.run([args.vllm_python, str(ROOT / "scripts" / "tiny_llama.py"), str(model), "--variant",
                            args.vllm_model], check=True, capture_output=True)  # fmt: skip
            print("starting vLLM (about a minute)...", file=sys.stderr)
            room = args.max_tokens + 512  # a prompt and its answer (the tiny Llama holds 8192 positions)
            log = work / "vllm.log"
            self.vllm = vllm_server.start(model, "never_stop", args.vllm_python, log=log, max_model_len=room)
            self.proxy = CountingProxy(self.vllm.base_url).start()
            self.base_url, self.model = self.proxy.base_url, "never_stop"

    def counters(self) -> tuple[float, int]:
        """(tokens generated, generate requests received) so far."""
        if self.kind == "sim":
            stats = self.sim.snapshot()
            return stats["tokens_generated"], stats["generate_requests"]
        return vllm_metrics(self.vllm.base_url)["generation_tokens"], len(self.proxy.times)

    def request_times(self) -> list[float]:
        return list(self.sim.snapshot()["generate_request_times"]) if self.kind == "sim" else list(self.proxy.times)

    def close(self) -> None:
        if self.kind == "sim":
            self.sim.stop()
        else:
            import vllm_server

            self.proxy.stop()
            vllm_server.stop(self.vllm.pid)


async def _one_wave(base_url: str, model: str, concurrency: int, max_tokens: int) -> float:
    payload = {"model": model, "prompt": "Question: What is 1 + 2?\nAnswer:", "max_tokens": max_tokens,
               "temperature": 0}  # fmt: skip
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:

        async def one() -> None:
            async with session.post(f"{base_url}/v1/completions", json=payload) as response:
                await response.read()

        started = time.monotonic()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        return time.monotonic() - started


async def _admission(target: Target, width: int, max_tokens: int) -> float:
    """Seconds from the first to the last of ``width`` streamed requests sent at once as the server
    records their arrival (each closed at its first chunk): the server's own serial cost of taking
    requests in, which delays the last of the first MIN_SAMPLES streams whoever sends them."""
    payload = {"model": target.model, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    seen = len(target.request_times())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def one(index: int) -> None:
            body = {**payload, "prompt": f"Question {index}: What is 1 + {index}?\nAnswer:"}
            async with session.post(f"{target.base_url}/v1/completions", json=body) as response:
                await response.content.readline()

        await asyncio.gather(*(one(index) for index in range(width)))
    arrivals = target.request_times()[seen:]
    return max(arrivals) - min(arrivals)


def _watch(target: Target, total: int, label: str, done: threading.Event, base: tuple[float, int]) -> None:
    with tqdm(total=total, desc=f"{label}: requests", unit="req", file=sys.stderr) as bar:
        while not done.wait(1.0):
            tokens, requests = target.counters()
            bar.n = requests - base[1]
            bar.set_postfix(tokens=f"{tokens - base[0]:,.0f}")
            bar.refresh()


def evaluate(
    target: Target, args: argparse.Namespace, work: Path, label: str, slow_start: str | None
) -> dict[str, Any]:
    """One lm-eval run; ``slow_start`` None: unprobed, else probed with that knob value."""
    probed = slow_start is not None
    task = write_task(work / "task", args.n)
    output = work / label
    lm_eval = task.lm_eval_command(
        target.base_url,
        target.model,
        output,
        args.max_tokens,
        args.concurrency,
        model_args="max_retries=3,timeout=3600",
    )
    command = [sys.executable, "-m", "probe", "run", "--", *lm_eval] if probed else lm_eval
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERLOOM_EVAL_PROBE") and k != "PYTHONPATH"}
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    if slow_start is not None:
        env[ENV_SLOW_START] = slow_start
    base = target.counters()
    seen_before = len(target.request_times())
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(target, args.n, label, done, base), daemon=True)
    watcher.start()
    started = time.time()
    with (work / f"{label}.log").open("w") as log:
        code = subprocess.call(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    ended = time.time()
    done.set()
    watcher.join()
    if code != 0:
        raise SystemExit(f"{label} lm-eval run failed (exit {code}); see {work / (label + '.log')}")
    time.sleep(2)  # let the server's counters settle (aborts are counted as they land)
    tokens, requests = target.counters()
    figures: dict[str, Any] = {
        "tokens": int(tokens - base[0]),
        "requests": requests - base[1],
        "wall_s": round(ended - started, 2),
        "verdict": classify(output, floor=0.01).status.value,
    }
    if probed:
        sidecar = read_sidecar(output)
        if sidecar.state != "valid":
            raise SystemExit(f"the probed run left no valid sidecar ({sidecar.state}); see {work / (label + '.log')}")
        tripped_at = sidecar.trip["tripped_at"]
        times = sorted(target.request_times()[seen_before:])
        figures.update(
            trip_s=round(tripped_at - min(times), 2),
            # When the last of the first MIN_SAMPLES requests reached the server: no trip can come
            # before that request's stream has begun.
            first_wave_arrived_s=round(times[min(len(times), Settings().min_samples) - 1] - times[0], 3),
            exit_after_trip_s=round(ended - tripped_at, 2),
            requests_after_trip=sum(1 for t in times if t > tripped_at),
            cancelled_in_flight=(sidecar.final or {}).get("cancelled_in_flight"),
            cause=sidecar.trip.get("cause"),
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=sorted(DEFAULTS), default="sim")
    parser.add_argument("--n", type=int, help="documents (default: 1319 sim, 200 vllm)")
    parser.add_argument("--concurrency", type=int, help="num_concurrent (default 64)")
    parser.add_argument("--max-tokens", type=int, help="budget per request (default: 16384 sim, 1024 vllm)")
    parser.add_argument("--seconds-per-token", type=float, default=0.00025, help="the simulated token clock")
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument(
        "--vllm-model",
        choices=("never_stop", "never_stop_wide"),
        default="never_stop",
        help="the tiny Llama vLLM serves (scripts/tiny_llama.py): one character a token, or four",
    )
    parser.add_argument(
        "--runs",
        default=",".join(RUNS),
        help="which of the never-stopping model's three runs to make (comma-separated, '' for none)",
    )
    parser.add_argument(
        "--loops",
        default=",".join(LOOPS),
        help="simulated never-stopping models to run probed after the three runs (comma-separated, '' for none)",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args()
    n, concurrency, max_tokens = DEFAULTS[args.server]
    args.n, args.concurrency = args.n or n, args.concurrency or concurrency
    args.max_tokens = args.max_tokens or max_tokens
    work = Path(tempfile.mkdtemp(prefix="bench-verdict-"))
    target = Target(args.server, args, work)
    min_samples = Settings().min_samples
    try:
        waves = {
            width: asyncio.run(_one_wave(target.base_url, target.model, width, args.max_tokens))
            for width in (min_samples, args.concurrency)
        }
        print(f"one wave of {min_samples} / {args.concurrency} x {args.max_tokens} tokens: "
              f"{waves[min_samples]:.1f} s / {waves[args.concurrency]:.1f} s", file=sys.stderr)  # fmt: skip
        result = {
            "server": args.server,
            "vllm_model": args.vllm_model if args.server == "vllm" else None,
            "n": args.n,
            "concurrency": args.concurrency,
            "max_tokens": args.max_tokens,
            "min_samples": min_samples,
            "seconds_per_token": args.seconds_per_token if args.server == "sim" else None,
            "one_generation_s": round(waves[min_samples], 2),
            "one_wave_s": round(waves[args.concurrency], 2),
            "loops": {},
        }
        for run in _names(args.runs, RUNS):
            result[run] = evaluate(target, args, work, run, RUNS[run])
        for mode in _names(args.loops, LOOPS) if args.server == "sim" else []:
            looping = Target("sim", args, work, mode)
            try:
                admission = asyncio.run(_admission(looping, min_samples, args.max_tokens))
                result["loops"][mode] = evaluate(looping, args, work, f"probed_{mode}", "auto")
                result["loops"][mode]["server_admission_s"] = round(admission, 3)
            finally:
                looping.close()
    finally:
        target.close()
    print(_report(result))
    if args.json:
        print(json.dumps(result))


def _names(text: str, known: Any) -> list[str]:
    """The comma-separated names in ``text``, each one of ``known``, or exit saying which is not."""
    names = [name for name in text.split(",") if name]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"unknown: {', '.join(unknown)} (choose from {', '.join(known)})")
    return names


def _saving(run: dict[str, Any], unprobed: dict[str, Any], key: str) -> str:
    return f"{1 - run[key] / unprobed[key]:.1%}"


def check(ok: bool) -> str:
    return "met" if ok else "MISSED"


def _report(r: dict[str, Any]) -> str:
    floor = r["min_samples"] * r["max_tokens"]
    one = r["one_generation_s"]
    lines = [
        f"server {r['server']}: N={r['n']}, C={r['concurrency']}, M={r['max_tokens']}, "
        f"one full-length generation (a wave of {r['min_samples']}) {one} s, a wave of C {r['one_wave_s']} s",
    ]
    u, p, off = (r.get(run) for run in RUNS)
    if u:
        lines.append(
            f"  unprobed: {u['tokens']:,} tokens, {u['requests']} requests, {u['wall_s']} s, verdict {u['verdict']}"
        )
    for name, f in (("probed", p), ("probed, slow start off", off)):
        if f:
            lines.append(
                f"  {name}: {f['tokens']:,} tokens ({f['tokens'] / floor:.3f} x MIN_SAMPLES x M), {f['requests']} "
                f"requests, {f['wall_s']} s, verdict {f['verdict']}; trip after {f['trip_s']} s "
                f"({f['trip_s'] / one:.2f} x one generation), exit {f['exit_after_trip_s']} s after it, "
                f"{f['requests_after_trip']} requests after it, {f['cancelled_in_flight']} cancelled in flight"
            )
    if p:
        lines.append(
            f"  targets (probed): tokens <= 1.15 x MIN_SAMPLES x M: {check(p['tokens'] <= 1.15 * floor)}; "
            f"trip <= 1.2 x one generation: {check(p['trip_s'] <= 1.2 * one)}; "
            f"lm-eval exits within 5 s of it: {check(p['exit_after_trip_s'] <= 5)}; "
            f"no request after the trip: {check(p['requests_after_trip'] == 0)}"
        )
    if u and p and off:
        lines.append(
            f"  saving: tokens {_saving(p, u, 'tokens')} (slow start off: {_saving(off, u, 'tokens')}); "
            f"wall time {_saving(p, u, 'wall_s')} (slow start off: {_saving(off, u, 'wall_s')})"
        )
    for mode, f in r.get("loops", {}).items():
        time_x, tokens_x = f["trip_s"] / one, f["tokens"] / floor
        # A loop must be caught by the detector; random text (no loop) by the cap rule, as before.
        target = (
            f"tripped by the cap rule: {check(f['cause'] == 'output_cap')}"
            if mode == "random"
            else f"time <= 0.05: {check(time_x <= 0.05)}, tokens <= 0.05: {check(tokens_x <= 0.05)}"
        )
        lines.append(
            f"  {mode} (probed, streamed): trip after {f['trip_s']} s ({time_x:.3f} x one generation), "
            f"{f['tokens']:,} tokens ({tokens_x:.3f} x MIN_SAMPLES x M), cause {f['cause']}, {f['requests']} "
            f"requests, verdict {f['verdict']}; {target}; the first {r['min_samples']} requests arrived over "
            f"{f['first_wave_arrived_s']} s (a bare client's {r['min_samples']} at once: {f['server_admission_s']} s)"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
