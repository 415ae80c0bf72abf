"""Time to read a result directory whose results file holds N tasks and N groups.

For each N, one results file like lm-eval's for a large group hierarchy: N tasks, each with
the probe's evidence (one of them cut short by a trip), and N groups in chains of ten (group
i holds task i and group i-1; ``--chain`` sets the length, N makes one chain N deep), so that
every group is folded over its tasks and subgroups.
Then ``eval-probe read DIR --json`` (the whole command line, output included) is timed with
the given Python, which decides the code measured (a worktree's overlay environment).

    python benchmarks/bench_reader.py                                   # N = 1,000 / 10,000 / 100,000
    python benchmarks/bench_reader.py --python /tmp/old/.venv/bin/python --sizes 1000 10000 --timeout 120

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

METRIC = "exact_match,strict-match"


def write_directory(root: Path, n: int, chain: int) -> Path:
    """A result directory with one results file of ``n`` tasks and ``n`` groups, nested in
    chains of ``chain`` (group i holds task i and group i-1); the file's path."""
    healthy = {
        "generate_requests": 40, "observations": 40, "finish_reasons": {"stop": 38, "length": 2}, "cut_off": 2,
        "cut_off_rate": 0.05, "causes": {"output_cap": 2}, "empty_answers": 0, "short_circuited": 0,
        "cancelled_in_flight": 0, "below_min_max_tokens": 0, "max_tokens": [2048], "tripped": False,
    }  # fmt: skip
    cut = {**healthy, "observations": 16, "finish_reasons": {"length": 16}, "cut_off": 16, "cut_off_rate": 1.0,
           "causes": {"output_cap": 16}, "short_circuited": 24, "tripped": True}  # fmt: skip
    tasks = {f"task_{i}": (cut if i == n // 2 else healthy) for i in range(n)}
    groups = {f"group_{i}": [f"task_{i}", *([f"group_{i - 1}"] if i % chain else [])] for i in range(n)}
    results = {name: {"alias": name, METRIC: 0.9} for name in [*tasks, *groups]}
    evidence = {"schema_version": 1, "run_id": "e" * 32 + ".1", "tripped": True, "tasks": tasks,
                "unattributed": None}  # fmt: skip
    document = {"results": results, "group_subtasks": groups, "date": time.time() - 60,
                "hyperloom_eval_probe": evidence}  # fmt: skip
    path = root / "model" / "results_2026-12-01T09-00-00.000000.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(document))
    return path


def measure(python: str, n: int, chain: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as directory:
        path = write_directory(Path(directory), n, chain)
        started = time.perf_counter()
        try:
            # cwd: the directory itself, so that `-m probe` imports what the given Python's
            # environment points to, not a checkout that happens to be the current directory.
            run = subprocess.run([python, "-m", "probe", "read", directory, "--json"], capture_output=True,
                                 timeout=timeout, cwd=directory)  # fmt: skip
        except subprocess.TimeoutExpired:
            return {"n": n, "chain": chain, "bytes": path.stat().st_size, "seconds": None, "timed_out_after_s": timeout}
        seconds = time.perf_counter() - started
        rows = json.loads(run.stdout) if run.returncode in (0, 1, 2) else None
        return {
            "n": n, "chain": chain, "bytes": path.stat().st_size, "seconds": round(seconds, 2), "exit": run.returncode,
            "verdicts": len(rows) if rows is not None else None,
            "below_floor": sum(v["status"] == "below_floor" for v in rows) if rows is not None else None,
        }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the Python whose probe package is measured")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--chain", type=int, default=10, help="groups nested in chains of this length (default 10)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a read counts as not finished")
    args = parser.parse_args()
    figures = []
    for n in args.sizes:
        figures.append(measure(args.python, n, args.chain, args.timeout))
        print(figures[-1], flush=True)
    print(json.dumps({"python": args.python, "figures": figures}))


if __name__ == "__main__":
    main()
