"""Operating characteristics of the trip rule, computed exactly and checked by Monte Carlo.

Model: each observation is at the cap with probability p, independently, and the rule is
checked after every observation (every "look") through N observations. For each setting:

- the probability that the rule ever fires on a model whose true at-cap rate is p
  (a healthy model: p = 0.1 ... 0.6), by dynamic programming over (looks, at-cap count);
- the number of observations it takes to fire when p is high (0.8 ... 1.0): mean, median
  and 95th percentile of the first firing look, from the same recursion.

A Monte Carlo run through the probe's own decision code (``probe.runtime.core.evidence.Tally`` and
``rule_fires``) checks every exact figure. Prints a Markdown table (and JSON with
``--json``) and writes a PNG plot.

    python benchmarks/bench_rule.py [--n 1319] [--trials 2000] [--plot benchmarks/rule.png]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from probe.runtime.core.contract import Settings
from probe.runtime.core.evidence import Tally
from probe.runtime.core.rule import rule_fires

HEALTHY = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6)
BROKEN = (0.8, 0.9, 0.95, 1.0)
SETTINGS = ((16, 0.75), (8, 0.75), (32, 0.75), (16, 0.6), (16, 0.9), (32, 0.9))


def first_fire_distribution(p: float, n: int, min_samples: int, ratio: float) -> list[float]:
    """P(the rule first fires at look t), for t = 1..n (index t-1); exact recursion."""
    alive = [1.0]  # alive[k]: P(k at-cap so far and not fired yet)
    fired = []
    for looks in range(1, n + 1):
        step = [0.0] * (looks + 1)
        for k, mass in enumerate(alive):
            if mass:
                step[k] += mass * (1 - p)
                step[k + 1] += mass * p
        now = 0.0
        if looks >= min_samples:
            for k in range(looks + 1):
                if step[k] and rule_fires(looks, k, min_samples, ratio):
                    now += step[k]
                    step[k] = 0.0
        fired.append(now)
        alive = step
    return fired


def summarise(fired: list[float]) -> dict[str, float | None]:
    total = sum(fired)
    if total < 0.5:
        return {"p_fire": total, "mean": None, "median": None, "p95": None}
    mean = sum((t + 1) * f for t, f in enumerate(fired)) / total
    cumulative, median, p95 = 0.0, None, None
    for t, f in enumerate(fired):
        cumulative += f / total
        if median is None and cumulative >= 0.5:
            median = t + 1
        if p95 is None and cumulative >= 0.95:
            p95 = t + 1
            break
    return {"p_fire": total, "mean": mean, "median": median, "p95": p95}


def monte_carlo(p: float, n: int, settings: Settings, trials: int, rng: random.Random) -> tuple[float, float | None]:
    """(fraction of runs that fired, mean firing look) through the probe's own Tally."""
    fired_at = []
    for _ in range(trials):
        tally = Tally()
        for look in range(1, n + 1):
            tally.add(["length" if rng.random() < p else "stop"], 16384)
            if tally.fires(settings):
                fired_at.append(look)
                break
    mean = sum(fired_at) / len(fired_at) if fired_at else None
    return len(fired_at) / trials, mean


def run(n: int, trials: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    jobs = [(m, r, p) for m, r in SETTINGS for p in (*HEALTHY, *BROKEN)]
    for min_samples, ratio, p in tqdm(jobs, desc="settings x rates", file=sys.stderr):
        exact = summarise(first_fire_distribution(p, n, min_samples, ratio))
        mc_fire, mc_mean = monte_carlo(p, n, Settings(min_samples=min_samples, length_ratio=ratio), trials, rng)
        rows.append(
            {"min_samples": min_samples, "ratio": ratio, "p": p, **exact, "mc_p_fire": mc_fire, "mc_mean": mc_mean}
        )
    return rows


def markdown(rows: list[dict], n: int) -> str:
    lines = [
        f"Probability that the rule ever fires within N={n} observations (healthy rates):",
        "",
        "| MIN_SAMPLES | LENGTH_RATIO | " + " | ".join(f"p={p}" for p in HEALTHY) + " |",
        "|---|---|" + "---|" * len(HEALTHY),
    ]
    for m, r in SETTINGS:
        cells = [next(x for x in rows if (x["min_samples"], x["ratio"], x["p"]) == (m, r, p)) for p in HEALTHY]
        lines.append(f"| {m} | {r} | " + " | ".join(_prob(c["p_fire"]) for c in cells) + " |")
    lines += [
        "",
        "Observations until it fires (mean / median / 95th percentile) on broken models:",
        "",
        "| MIN_SAMPLES | LENGTH_RATIO | " + " | ".join(f"p={p}" for p in BROKEN) + " |",
        "|---|---|" + "---|" * len(BROKEN),
    ]
    for m, r in SETTINGS:
        cells = [next(x for x in rows if (x["min_samples"], x["ratio"], x["p"]) == (m, r, p)) for p in BROKEN]
        lines.append(f"| {m} | {r} | " + " | ".join(_looks(c) for c in cells) + " |")
    worst = max(abs(x["p_fire"] - x["mc_p_fire"]) for x in rows)
    lines += ["", f"Largest gap between exact and Monte Carlo firing probability: {worst:.4f}"]
    return "\n".join(lines)


def _prob(value: float) -> str:
    return "<1e-12" if value < 1e-12 else f"{value:.2e}" if value < 0.001 else f"{value:.3f}"


def _looks(row: dict) -> str:
    if row["mean"] is None:
        return f"fires with P={row['p_fire']:.3f}"
    return f"{row['mean']:.1f} / {row['median']} / {row['p95']}" + (
        "" if row["p_fire"] > 0.999 else f" (P={row['p_fire']:.3f})"
    )


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4.5))
    rates = [*HEALTHY, *BROKEN]
    for m, r in SETTINGS:
        values = [next(x for x in rows if (x["min_samples"], x["ratio"], x["p"]) == (m, r, p))["p_fire"] for p in rates]
        axis.plot(rates, [max(v, 1e-16) for v in values], marker="o", label=f"MIN_SAMPLES={m}, RATIO={r}")
    axis.set_yscale("log")
    axis.set_xlabel("true fraction of generations at the cap (p)")
    axis.set_ylabel("P(rule fires within N looks)")
    axis.set_title("lm-eval-probe trip rule: operating characteristic (exact)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1319, help="observations per run (GSM8K's test set: 1319)")
    parser.add_argument("--trials", type=int, default=2000, help="Monte Carlo runs per setting and rate")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--plot", type=Path, default=Path(__file__).parent / "rule.png")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.n, args.trials, args.seed)
    print(markdown(rows, args.n))
    plot(rows, args.plot)
    print(f"\nplot: {args.plot}")
    if args.json:
        print(json.dumps({"n": args.n, "trials": args.trials, "rows": rows}))


if __name__ == "__main__":
    main()
