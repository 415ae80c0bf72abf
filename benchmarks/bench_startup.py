"""What the probe's sitecustomize.py costs a Python process that never imports lm-eval.

Each variant is written into a directory of its own, then ``python -X importtime -c pass`` runs
with that directory on PYTHONPATH, the variants alternating, ``--runs`` times each. The figure
is the median cumulative time of the ``sitecustomize`` import. Variants: a one-line file (what
any sitecustomize.py costs), the text the patcher injects, the chaining text that ``install``
and ``run`` write, and that text shadowing another sitecustomize.py (only then is the chain
compiled), next to that other file alone. PYTHONDONTWRITEBYTECODE=1 (InferenceX sets it)
compiles the file in every process; ``--cached`` lets Python keep its bytecode instead.
Target: under 2 ms, standard library only.

    python benchmarks/bench_startup.py [--runs 40] [--cached] [--python python3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # tests/support: the one reader of -X importtime
from support.importtime import sitecustomize_cost  # noqa: E402

from probe.inject import sitecustomize_text  # noqa: E402

SHADOWED = "SHADOWED = True\n"


def variants(work: Path) -> dict[str, str]:
    """Each variant's PYTHONPATH, its directories made and written."""
    texts = {
        "one_line": "x = 1\n",
        "patched": sitecustomize_text(chain=False),
        "chaining": sitecustomize_text(chain=True),
        "chaining_another": sitecustomize_text(chain=True),
    }
    paths = {}
    for name, text in texts.items():
        (work / name).mkdir()
        (work / name / "sitecustomize.py").write_text(text)
        paths[name] = str(work / name)
    (work / "another").mkdir()
    (work / "another" / "sitecustomize.py").write_text(SHADOWED)
    paths["chaining_another"] += os.pathsep + str(work / "another")
    paths["another_alone"] = str(work / "another")  # what the user's own file costs without the probe
    return paths


def measure(python: str, paths: dict[str, str], runs: int, cached: bool) -> dict[str, dict]:
    """Median microseconds and every module imported, per variant, the variants alternating."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HYPERLOOM_EVAL_PROBE", "PYTHON"))}
    if not cached:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    micros: dict[str, list[int]] = {name: [] for name in paths}
    imported: dict[str, set[str]] = {name: set() for name in paths}
    for run in range(runs + (1 if cached else 0)):  # with --cached, the first round writes the bytecode
        for name, path in paths.items():
            done = subprocess.run(
                [python, "-X", "importtime", "-c", "pass"],
                env={**env, "PYTHONPATH": path},
                capture_output=True,
                text=True,
                cwd=tempfile.gettempdir(),
                check=True,
            )
            us, nested = sitecustomize_cost(done.stderr)
            if cached and run == 0:
                continue
            micros[name].append(us)
            imported[name].update(nested)
        print(f"\rstart-up: {run + 1} of {runs + (1 if cached else 0)} rounds", end="", file=sys.stderr)
    print(file=sys.stderr)
    return {
        name: {
            "median_ms": round(statistics.median(values) / 1000, 3),
            "quartiles_ms": [round(q / 1000, 3) for q in statistics.quantiles(values, n=4)],
            "imports": sorted(imported[name]),
        }
        for name, values in micros.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="rounds; each runs every variant once")
    parser.add_argument("--cached", action="store_true", help="let Python keep the file's bytecode")
    parser.add_argument("--python", default="python3", help="the interpreter to start")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.runs < 2:
        parser.error("--runs must be at least 2 (quartiles need two figures)")
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as work:
        result = measure(args.python, variants(Path(work)), args.runs, args.cached)
    stdlib = set(sys.stdlib_module_names) | {"_distutils_hack"}
    only_stdlib = all(m.split(".")[0] in stdlib for v in result.values() for m in v["imports"])
    mode = "bytecode cached" if args.cached else "PYTHONDONTWRITEBYTECODE=1"
    print(f"sitecustomize import, median of {args.runs} runs of {args.python} -X importtime -c pass ({mode}):")
    for name, figures in result.items():
        q1, _, q3 = figures["quartiles_ms"]
        imports = ", ".join(figures["imports"]) or "nothing"
        print(f"  {name}: {figures['median_ms']} ms (quartiles {q1}-{q3}); imported: {imports}")
    print(f"  standard library only: {only_stdlib} (target: under 2 ms)")
    if args.json:
        print(json.dumps({"runs": args.runs, "mode": mode, "stdlib_only": only_stdlib, "variants": result}))


if __name__ == "__main__":
    main()
