"""Cost of the probe on a healthy run, and its start-up cost in a process without lm-eval.

1. A stopping (healthy) simulated model evaluated by real lm-eval, unprobed and probed,
   alternating, ``--reps`` times each: wall-time ratio (median probed / median unprobed),
   and whether the answers (``--log_samples``) and scores are identical.
2. ``python -X importtime -c pass`` under PYTHONDONTWRITEBYTECODE=1 (as InferenceX sets it)
   with the probe's sitecustomize.py, ``--startup-runs`` times: the median time of the
   ``sitecustomize`` import (the text the patcher injects, and the chaining variant), next to
   a one-line sitecustomize.py, and every module it imported (must be standard library).

    python benchmarks/bench_healthy.py [--n 1319] [--concurrency 64] [--reps 3] [--json]
"""

from __future__ import annotations

import argparse
import json
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
from support.importtime import sitecustomize_cost  # noqa: E402

from probe.demo.localtask import write_task  # noqa: E402
from probe.demo.simserver import SimServer  # noqa: E402
from probe.inject import sitecustomize_text  # noqa: E402
from probe.reader.results import read_score  # noqa: E402


def healthy_runs(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    task = write_task(work / "task", args.n)
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize_text(chain=True))
    walls: dict[str, list[float]] = {"unprobed": [], "probed": []}
    answers: dict[str, list] = {}
    scores: dict[str, set] = {"unprobed": set(), "probed": set()}
    with SimServer("healthy", seconds_per_token=args.seconds_per_token) as server:
        jobs = [(rep, label) for rep in range(args.reps) for label in ("unprobed", "probed")]
        for rep, label in tqdm(jobs, desc="healthy lm-eval runs", file=sys.stderr):
            output = work / f"{label}-{rep}"
            command = task.lm_eval_command(
                server.base_url, "sim", output, args.max_tokens, args.concurrency, "--log_samples"
            )
            env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERLOOM_EVAL_PROBE")}
            env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", RESULT_DIR=str(output))
            env["PYTHONPATH"] = str(site) if label == "probed" else ""
            started = time.monotonic()
            subprocess.run(command, env=env, check=True, capture_output=True)
            walls[label].append(time.monotonic() - started)
            (samples,) = output.glob("*/samples_*.jsonl")
            rows = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda r: r["doc_id"])
            answers.setdefault(label, [r["resps"] for r in rows])
            if [r["resps"] for r in rows] != answers[label]:
                raise SystemExit(f"{label} answers changed between repetitions: the simulated model is deterministic")
            scores[label].add(read_score(output).raw)
    ratio = statistics.median(walls["probed"]) / statistics.median(walls["unprobed"])
    return {
        "n": args.n,
        "concurrency": args.concurrency,
        "reps": args.reps,
        "unprobed_wall_s": [round(w, 2) for w in walls["unprobed"]],
        "probed_wall_s": [round(w, 2) for w in walls["probed"]],
        "wall_ratio_median": round(ratio, 4),
        "identical_answers": answers["probed"] == answers["unprobed"],
        "scores": {k: sorted(v) for k, v in scores.items()},
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
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=2048)
    parser.add_argument("--seconds-per-token", type=float, default=0.05, help="the healthy model's token clock")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--startup-runs", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-healthy-"))
    result = {"healthy": healthy_runs(args, work), "startup": startup(args, work)}
    h, s = result["healthy"], result["startup"]
    print(f"healthy run, N={h['n']}, C={h['concurrency']}, {h['reps']} reps each:")
    print(f"  unprobed wall s: {h['unprobed_wall_s']}; probed wall s: {h['probed_wall_s']}")
    print(f"  median wall-time ratio probed/unprobed: {h['wall_ratio_median']} (target <= 1.02)")
    print(f"  identical answers: {h['identical_answers']}; scores: {h['scores']}")
    print(f"start-up (median of {s['runs']} runs of python3 -X importtime -c pass, PYTHONDONTWRITEBYTECODE=1):")
    for name in ("one_line", "probe_patch_mode", "probe_standalone"):
        print(f"  {name}: {s[name]['median_ms']} ms; imported: {s[name]['imports'] or 'nothing'}")
    print(f"  standard library only: {s['stdlib_only']} (target: under 2 ms)")
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
