"""Cost of the probe on a healthy run (its start-up cost: ``bench_startup.py``).

Stopping (healthy) simulated models whose answer lengths vary as real ones do (the
simulated server's ``lognormal`` and ``reasoning`` length profiles), evaluated by real
lm-eval at each ``--concurrency``, unprobed and probed alternating, ``--reps`` times each:
wall-time ratio (median probed / median unprobed), and whether the answers
(``--log_samples``) and scores are identical. The probed runs use
``HYPERLOOM_EVAL_PROBE_SLOW_START=--slow-start`` (default ``on``, to measure the slow
start's cost everywhere, also where ``auto`` leaves it off) and
``HYPERLOOM_EVAL_PROBE_STREAM=--stream`` (default ``auto``: the probed runs stream). The token clock is set per
run so that the generation takes about ``--gen-seconds`` (more concurrency, slower
clock): the lm-eval start-up, the same in both arms, is then a fixed share of each run.
``--extra-arms detector_off,stream_off,stream_on`` adds probed arms with the loop detector
off, with nothing streamed and with every request streamed, alternated with the two in the
same repetitions.
``--server vllm`` runs the same arms against real vLLM (CPU) serving the tiny Llama's
``countdown`` variant (a healthy model whose answer lengths follow the ``lognormal``
profile, prompt by prompt, and whose text never repeats), through a counting proxy that
times the span; its clock is vLLM's own, so fewer requests at once decode faster, as on
a real server.

    python benchmarks/bench_healthy.py [--n 1319] [--concurrency 16,64,256]
        [--profiles lognormal,reasoning] [--reps 3] [--slow-start on] [--stream auto]
        [--extra-arms detector_off,stream_off,stream_on] [--server sim|vllm] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/support
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import vllm_server  # noqa: E402
from countingproxy import CountingProxy  # noqa: E402
from support.hf import write_task_file  # noqa: E402
from tiny_llama import CHAIN, CHAIN_LENGTH, countdown_prompt  # noqa: E402

from probe.demo.localtask import LocalTask, write_task  # noqa: E402
from probe.demo.simserver import LENGTHS, SimServer  # noqa: E402
from probe.inject import sitecustomize_text  # noqa: E402
from probe.reader.verdict import classify  # noqa: E402
from probe.runtime.core.contract import ENV_DETECTOR, ENV_SLOW_START, ENV_STREAM  # noqa: E402

# More probed arms, each alternated with the others in the same repetitions: what the probed
# arm's settings become in each (to tell the stream parsing's cost from the loop detector's).
EXTRA_ARMS = {
    "detector_off": {ENV_DETECTOR: "off"},
    "stream_off": {ENV_STREAM: "off"},
    "stream_on": {ENV_STREAM: "on"},  # every request streamed (auto streams only while a verdict is open)
}


def mean_tokens(profile: str) -> float:
    """The mean answer length of a log-normal length profile."""
    median, sigma = LENGTHS[profile]  # type: ignore[misc]
    return median * math.exp(sigma**2 / 2)


def write_countdown_task(directory: Path, n_docs: int, profile: str) -> LocalTask:
    """``n_docs`` prompts the countdown model answers in lengths drawn from ``profile``
    (seeded, so every run asks the same), each answer its exact match: a score of 1.0."""
    median, sigma = LENGTHS[profile]  # type: ignore[misc]
    draw = random.Random(0)
    docs = []
    for i in range(n_docs):
        length = min(CHAIN_LENGTH - 1, max(1, round(draw.lognormvariate(math.log(median), sigma))))
        docs.append({"text": countdown_prompt(length, f"Item {i}, go on: "), "answer": "".join(CHAIN[-length:])})
    fields = {"generation_kwargs": {"until": ["\n\n"], "temperature": 0}, "metric_list": [{"metric": "exact_match"}]}
    written = write_task_file(directory, "probe_countdown", "gsm8k", "generate_until", fields, docs)
    return LocalTask(written.yaml, written.name)


def build_countdown(python: str, work: Path) -> Path:
    """The tiny Llama's countdown variant, built by the vLLM environment's ``python`` in ``work``."""
    model = work / "countdown"
    subprocess.run([python, str(ROOT / "scripts" / "tiny_llama.py"), str(model), "--variant", "countdown"],
                   check=True, capture_output=True)  # fmt: skip
    return model


class ServedCountdown:
    """vLLM serving the countdown model behind the counting proxy: the simulated server's
    ``base_url`` and the ``snapshot`` keys the healthy runs read."""

    model = "countdown"

    def __init__(self, python: str, work: Path, max_tokens: int) -> None:
        self.python, self.work, self.max_tokens = python, work, max_tokens

    def __enter__(self) -> ServedCountdown:
        model = build_countdown(self.python, self.work)
        self.vllm = vllm_server.start(
            model, self.model, self.python, log=self.work / "vllm.log", max_model_len=self.max_tokens + 64
        )
        self.proxy = CountingProxy(self.vllm.base_url).start()
        self.base_url = self.proxy.base_url
        return self

    def snapshot(self) -> dict[str, Any]:
        times = list(self.proxy.times)
        return {"generate_requests": len(times), "generate_request_times": times, "streamed": self.proxy.streamed,
                "last_completed_at": self.proxy.last_completed_at}  # fmt: skip

    def __exit__(self, *exc: object) -> None:
        self.proxy.stop()
        vllm_server.stop(self.vllm.pid)


# One run of lm-eval for an arm: given its output directory and environment, it returns the
# generation span (from the first generate request to the last answer) and how many of its
# generate requests were streamed.
Run = Callable[[Path, dict[str, str]], tuple[float, int]]


def served_run(server: Any, task: LocalTask, model: str, max_tokens: int, concurrency: int) -> Run:
    """lm-eval's completions client against ``server`` (the simulated one, or ServedCountdown),
    its span and streamed requests read from the server's own record of requests and answers."""

    def run(output: Path, env: dict[str, str]) -> tuple[float, int]:
        command = task.lm_eval_command(server.base_url, model, output, max_tokens, concurrency, "--log_samples")
        before = server.snapshot()
        subprocess.run(command, env=env, check=True, capture_output=True)
        stats = server.snapshot()
        span = stats["last_completed_at"] - stats["generate_request_times"][before["generate_requests"]]
        return span, stats["streamed"] - before["streamed"]

    return run


def healthy_runs(
    args: argparse.Namespace, work: Path, site: Path, profile: str, concurrency: int, run: Run, clock: float | None
) -> dict[str, Any]:
    """One profile at one concurrency: unprobed and probed alternating, ``args.reps`` each,
    each a ``run`` (``clock``: the server's seconds per token, None for vLLM's own)."""
    labels = ("unprobed", "probed", *args.extra_arms)
    walls: dict[str, list[float]] = {label: [] for label in labels}
    # From the first generate request to the last answer: the wall time without lm-eval's
    # start-up and scoring, i.e. the part the slow start can change, as in a long real run.
    spans: dict[str, list[float]] = {label: [] for label in labels}
    streamed: dict[str, list[int]] = {label: [] for label in labels}
    answers: dict[str, list] = {}
    scores: dict[str, set] = {label: set() for label in labels}
    jobs = [(rep, label) for rep in range(args.reps) for label in labels]
    for rep, label in tqdm(jobs, desc=f"healthy {profile} C={concurrency}", file=sys.stderr):
        output = work / f"{profile}-{concurrency}-{label}-{rep}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERLOOM_EVAL_PROBE")}
        env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", RESULT_DIR=str(output))
        env["PYTHONPATH"] = str(site) if label != "unprobed" else ""
        env[ENV_SLOW_START] = args.slow_start
        env[ENV_STREAM] = args.stream
        env.update(EXTRA_ARMS.get(label, {}))
        started = time.monotonic()
        span, streamed_requests = run(output, env)
        spans[label].append(span)
        streamed[label].append(streamed_requests)
        walls[label].append(time.monotonic() - started)
        (samples,) = output.glob("*/samples_*.jsonl")
        rows = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda r: r["doc_id"])
        answers.setdefault(label, [r["resps"] for r in rows])
        if [r["resps"] for r in rows] != answers[label]:
            raise SystemExit(f"{label} answers changed between repetitions: the model is deterministic (greedy)")
        scores[label].add(classify(output, floor=0.0).score)
    ratio = statistics.median(walls["probed"]) / statistics.median(walls["unprobed"])
    span_ratio = statistics.median(spans["probed"]) / statistics.median(spans["unprobed"])
    return {
        "profile": profile,
        "concurrency": concurrency,
        "seconds_per_token": None if clock is None else round(clock, 7),
        "unprobed_wall_s": [round(w, 2) for w in walls["unprobed"]],
        "probed_wall_s": [round(w, 2) for w in walls["probed"]],
        "wall_ratio_median": round(ratio, 4),
        "unprobed_span_s": [round(w, 2) for w in spans["unprobed"]],
        "probed_span_s": [round(w, 2) for w in spans["probed"]],
        "span_ratio_median": round(span_ratio, 4),
        "probed_streamed": streamed["probed"],
        "identical_answers": answers["probed"] == answers["unprobed"],
        "scores": {k: sorted(v) for k, v in scores.items()},
        "arms": {
            label: {
                "span_s": [round(w, 2) for w in spans[label]],
                "span_ratio_median": round(statistics.median(spans[label]) / statistics.median(spans["unprobed"]), 4),
                "streamed": streamed[label],
                "identical_answers": answers[label] == answers["unprobed"],
            }
            for label in args.extra_arms
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1319)
    parser.add_argument("--concurrency", default="16,64,256", help="comma-separated num_concurrent values")
    parser.add_argument("--profiles", default="lognormal,reasoning", help="comma-separated length profiles")
    parser.add_argument("--max-tokens", type=int, help="budget per request (default: 16384 sim, 4096 vllm)")
    parser.add_argument("--gen-seconds", type=float, default=10.0, help="generation time per run the clock aims at")
    parser.add_argument("--slow-start", default="on", help="HYPERLOOM_EVAL_PROBE_SLOW_START for the probed runs")
    parser.add_argument("--stream", default="auto", help="HYPERLOOM_EVAL_PROBE_STREAM for the probed runs")
    parser.add_argument(
        "--extra-arms",
        default="",
        help=f"more probed arms, comma-separated, alternated with the others: {', '.join(EXTRA_ARMS)}",
    )
    parser.add_argument(
        "--server",
        choices=("sim", "vllm"),
        default="sim",
        help="the simulated server, or vLLM serving the countdown model",
    )
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.extra_arms = [arm for arm in args.extra_arms.split(",") if arm]
    if unknown := [arm for arm in args.extra_arms if arm not in EXTRA_ARMS]:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(EXTRA_ARMS)}")
    profiles = args.profiles.split(",")
    if args.server != "sim" and profiles != ["lognormal"]:
        parser.error(f"--server {args.server} runs the lognormal profile only: pass --profiles lognormal")
    args.max_tokens = args.max_tokens or (16384 if args.server == "sim" else 4096)
    work = Path(tempfile.mkdtemp(prefix="bench-healthy-"))
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize_text(chain=True))
    started = time.monotonic()
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    healthy = []
    if args.server == "sim":
        task = write_task(work / "task", args.n)
        for profile in profiles:
            for concurrency in concurrencies:
                clock = args.gen_seconds * concurrency / (args.n * mean_tokens(profile))
                with SimServer("healthy", seconds_per_token=clock, lengths=profile) as server:
                    run = served_run(server, task, "sim", args.max_tokens, concurrency)
                    healthy.append(healthy_runs(args, work, site, profile, concurrency, run, clock))
    else:
        task = write_countdown_task(work / "task", args.n, "lognormal")
        with ServedCountdown(args.vllm_python, work, args.max_tokens) as served:
            for concurrency in concurrencies:
                run = served_run(served, task, served.model, args.max_tokens, concurrency)
                healthy.append(healthy_runs(args, work, site, "lognormal", concurrency, run, None))
    result = {
        "server": args.server,
        "n": args.n,
        "max_tokens": args.max_tokens,
        "reps": args.reps,
        "slow_start": args.slow_start,
        "stream": args.stream,
        "extra_arms": args.extra_arms,
        "healthy": healthy,
        "healthy_minutes": round((time.monotonic() - started) / 60, 1),
    }
    print(f"healthy runs, N={args.n}, max_tokens={args.max_tokens}, {args.reps} reps each, "
          f"probed with {ENV_SLOW_START}={args.slow_start}, {ENV_STREAM}={args.stream} "
          f"({result['healthy_minutes']} min):")  # fmt: skip
    for h in healthy:
        clock = "vLLM's clock" if h["seconds_per_token"] is None else f"{h['seconds_per_token'] * 1000:.4f} ms/token"
        print(f"  {h['profile']} C={h['concurrency']} ({clock}): "
              f"unprobed {h['unprobed_wall_s']} s, probed {h['probed_wall_s']} s, "
              f"median ratio {h['wall_ratio_median']} (target <= 1.02); generation spans: unprobed "
              f"{h['unprobed_span_s']} s, probed {h['probed_span_s']} s, median ratio {h['span_ratio_median']}; "
              f"streamed requests {h['probed_streamed']}; identical answers {h['identical_answers']}; "
              f"scores {h['scores']}")  # fmt: skip
        for arm, a in h["arms"].items():
            print(f"    {arm}: spans {a['span_s']} s, median ratio {a['span_ratio_median']}, "
                  f"streamed requests {a['streamed']}, identical answers {a['identical_answers']}")  # fmt: skip
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
