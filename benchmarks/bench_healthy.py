"""Cost of the probe on a healthy run, and its start-up cost in a process without lm-eval.

1. Stopping (healthy) simulated models whose answer lengths vary as real ones do (the
   simulated server's ``lognormal`` and ``reasoning`` length profiles), evaluated by real
   lm-eval at each ``--concurrency``, unprobed and probed alternating, ``--reps`` times each:
   wall-time ratio (median probed / median unprobed), and whether the answers
   (``--log_samples``) and scores are identical. The probed runs use
   ``HYPERLOOM_EVAL_PROBE_SLOW_START=--slow-start`` (default ``on``, to measure the slow
   start's cost everywhere, also where ``auto`` leaves it off) and
   ``HYPERLOOM_EVAL_PROBE_STREAM=--stream`` (default ``auto``: the probed runs stream). The token clock is set per
   run so that the generation takes about ``--gen-seconds`` (more concurrency, slower
   clock): the lm-eval start-up, the same in both arms, is then a fixed share of each run.
   ``--extra-arms detector_off,stream_off`` adds probed arms with the loop detector off and
   with nothing streamed, alternated with the two in the same repetitions.
2. ``python -X importtime -c pass`` under PYTHONDONTWRITEBYTECODE=1 (as InferenceX sets it)
   with the probe's sitecustomize.py, ``--startup-runs`` times: the median time of the
   ``sitecustomize`` import (the text the patcher injects, and the chaining variant), next to
   a one-line sitecustomize.py, and every module it imported (must be standard library).

    python benchmarks/bench_healthy.py [--n 1319] [--concurrency 16,64,256]
        [--profiles lognormal,reasoning] [--reps 3] [--slow-start on] [--stream auto]
        [--extra-arms detector_off,stream_off] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/support: the one reader of -X importtime
from support.importtime import sitecustomize_cost  # noqa: E402

from probe.demo.localtask import LocalTask, write_task  # noqa: E402
from probe.demo.simserver import LENGTHS, SimServer  # noqa: E402
from probe.inject import sitecustomize_text  # noqa: E402
from probe.reader.verdict import classify  # noqa: E402
from probe.runtime.contract import ENV_DETECTOR, ENV_SLOW_START, ENV_STREAM  # noqa: E402

# More probed arms, each alternated with the others in the same repetitions: what the probed
# arm's settings become in each (to tell the stream parsing's cost from the loop detector's).
EXTRA_ARMS = {"detector_off": {ENV_DETECTOR: "off"}, "stream_off": {ENV_STREAM: "off"}}


def mean_tokens(profile: str) -> float:
    """The mean answer length of a log-normal length profile."""
    median, sigma = LENGTHS[profile]  # type: ignore[misc]
    return median * math.exp(sigma**2 / 2)


def healthy_runs(
    args: argparse.Namespace, work: Path, task: LocalTask, site: Path, profile: str, concurrency: int
) -> dict[str, Any]:
    """One profile at one concurrency: unprobed and probed alternating, ``args.reps`` each."""
    clock = args.gen_seconds * concurrency / (args.n * mean_tokens(profile))
    labels = ("unprobed", "probed", *args.extra_arms)
    walls: dict[str, list[float]] = {label: [] for label in labels}
    # From the first generate request to the last answer: the wall time without lm-eval's
    # start-up and scoring, i.e. the part the slow start can change, as in a long real run.
    spans: dict[str, list[float]] = {label: [] for label in labels}
    answers: dict[str, list] = {}
    scores: dict[str, set] = {label: set() for label in labels}
    with SimServer("healthy", seconds_per_token=clock, lengths=profile) as server:
        jobs = [(rep, label) for rep in range(args.reps) for label in labels]
        for rep, label in tqdm(jobs, desc=f"healthy {profile} C={concurrency}", file=sys.stderr):
            output = work / f"{profile}-{concurrency}-{label}-{rep}"
            command = task.lm_eval_command(
                server.base_url, "sim", output, args.max_tokens, concurrency, "--log_samples"
            )
            env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERLOOM_EVAL_PROBE")}
            env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", RESULT_DIR=str(output))
            env["PYTHONPATH"] = str(site) if label != "unprobed" else ""
            env[ENV_SLOW_START] = args.slow_start
            env[ENV_STREAM] = args.stream
            env.update(EXTRA_ARMS.get(label, {}))
            seen = server.snapshot()["generate_requests"]
            started = time.monotonic()
            subprocess.run(command, env=env, check=True, capture_output=True)
            walls[label].append(time.monotonic() - started)
            stats = server.snapshot()
            spans[label].append(stats["last_completed_at"] - stats["generate_request_times"][seen])
            (samples,) = output.glob("*/samples_*.jsonl")
            rows = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda r: r["doc_id"])
            answers.setdefault(label, [r["resps"] for r in rows])
            if [r["resps"] for r in rows] != answers[label]:
                raise SystemExit(f"{label} answers changed between repetitions: the simulated model is deterministic")
            scores[label].add(classify(output, floor=0.0).score)
    ratio = statistics.median(walls["probed"]) / statistics.median(walls["unprobed"])
    span_ratio = statistics.median(spans["probed"]) / statistics.median(spans["unprobed"])
    return {
        "profile": profile,
        "concurrency": concurrency,
        "seconds_per_token": round(clock, 7),
        "unprobed_wall_s": [round(w, 2) for w in walls["unprobed"]],
        "probed_wall_s": [round(w, 2) for w in walls["probed"]],
        "wall_ratio_median": round(ratio, 4),
        "unprobed_span_s": [round(w, 2) for w in spans["unprobed"]],
        "probed_span_s": [round(w, 2) for w in spans["probed"]],
        "span_ratio_median": round(span_ratio, 4),
        "identical_answers": answers["probed"] == answers["unprobed"],
        "scores": {k: sorted(v) for k, v in scores.items()},
        "arms": {
            label: {
                "span_s": [round(w, 2) for w in spans[label]],
                "span_ratio_median": round(statistics.median(spans[label]) / statistics.median(spans["unprobed"]), 4),
                "identical_answers": answers[label] == answers["unprobed"],
            }
            for label in args.extra_arms
        },
    }


def _import_time(site: Path) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERLOOM_EVAL_PROBE")}
    env.update(PYTHONPATH=str(site), PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run(["python3", "-X", "importtime", "-c", "pass"], env=env, capture_output=True, text=True)
    return sitecustomize_cost(run.stderr)


def startup(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    variants = {
        "one_line": "x = 1\n",
        "probe_patch_mode": sitecustomize_text(chain=False),
        "probe_standalone": sitecustomize_text(chain=True),
    }
    result: dict[str, Any] = {"runs": args.startup_runs, "python": sys.version.split()[0]}
    for name, text in variants.items():
        site = work / name
        site.mkdir()
        (site / "sitecustomize.py").write_text(text)
        micros, imported = [], set()
        for _ in tqdm(range(args.startup_runs), desc=f"start-up {name}", file=sys.stderr):
            us, nested = _import_time(site)
            micros.append(us)
            imported.update(nested)
        result[name] = {"median_ms": round(statistics.median(micros) / 1000, 3), "imports": sorted(imported)}
    stdlib = set(sys.stdlib_module_names)
    imported = result["probe_standalone"]["imports"] + result["probe_patch_mode"]["imports"]
    result["stdlib_only"] = all(name.split(".")[0] in stdlib or name == "_distutils_hack" for name in imported)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1319)
    parser.add_argument("--concurrency", default="16,64,256", help="comma-separated num_concurrent values")
    parser.add_argument("--profiles", default="lognormal,reasoning", help="comma-separated length profiles")
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--gen-seconds", type=float, default=10.0, help="generation time per run the clock aims at")
    parser.add_argument("--slow-start", default="on", help="HYPERLOOM_EVAL_PROBE_SLOW_START for the probed runs")
    parser.add_argument("--stream", default="auto", help="HYPERLOOM_EVAL_PROBE_STREAM for the probed runs")
    parser.add_argument(
        "--extra-arms",
        default="",
        help=f"more probed arms, comma-separated, alternated with the others: {', '.join(EXTRA_ARMS)}",
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--startup-runs", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.extra_arms = [arm for arm in args.extra_arms.split(",") if arm]
    if unknown := [arm for arm in args.extra_arms if arm not in EXTRA_ARMS]:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(EXTRA_ARMS)}")
    work = Path(tempfile.mkdtemp(prefix="bench-healthy-"))
    task = write_task(work / "task", args.n)
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize_text(chain=True))
    started = time.monotonic()
    healthy = [
        healthy_runs(args, work, task, site, profile, int(concurrency))
        for profile in args.profiles.split(",")
        for concurrency in args.concurrency.split(",")
    ]
    result = {
        "n": args.n,
        "max_tokens": args.max_tokens,
        "reps": args.reps,
        "slow_start": args.slow_start,
        "stream": args.stream,
        "extra_arms": args.extra_arms,
        "healthy": healthy,
        "healthy_minutes": round((time.monotonic() - started) / 60, 1),
        "startup": startup(args, work),
    }
    print(f"healthy runs, N={args.n}, max_tokens={args.max_tokens}, {args.reps} reps each, "
          f"probed with {ENV_SLOW_START}={args.slow_start}, {ENV_STREAM}={args.stream} "
          f"({result['healthy_minutes']} min):")  # fmt: skip
    for h in healthy:
        print(f"  {h['profile']} C={h['concurrency']} ({h['seconds_per_token'] * 1000:.4f} ms/token): "
              f"unprobed {h['unprobed_wall_s']} s, probed {h['probed_wall_s']} s, "
              f"median ratio {h['wall_ratio_median']} (target <= 1.02); generation spans: unprobed "
              f"{h['unprobed_span_s']} s, probed {h['probed_span_s']} s, median ratio {h['span_ratio_median']}; "
              f"identical answers {h['identical_answers']}; scores {h['scores']}")  # fmt: skip
        for arm, a in h["arms"].items():
            print(f"    {arm}: spans {a['span_s']} s, median ratio {a['span_ratio_median']}, "
                  f"identical answers {a['identical_answers']}")  # fmt: skip
    s = result["startup"]
    print(f"start-up (median of {s['runs']} runs of python3 -X importtime -c pass, PYTHONDONTWRITEBYTECODE=1):")
    for name in ("one_line", "probe_patch_mode", "probe_standalone"):
        print(f"  {name}: {s[name]['median_ms']} ms; imported: {s[name]['imports'] or 'nothing'}")
    print(f"  standard library only: {s['stdlib_only']} (target: under 2 ms)")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
