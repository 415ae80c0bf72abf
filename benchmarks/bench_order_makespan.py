"""What the order of sending alone does to a healthy run's generation span (pure arithmetic).

With a fixed clock per token (the simulated server's), a run's generation span is the makespan
of its answers over ``--concurrency`` places, each answer starting as soon as a place frees (list
scheduling). lm-eval sends longest prompt first; the probe sends a seeded uniform random order
(its gate). For the prompts of a ``--log_samples`` file and the simulated server's answer
lengths (``answer_tokens``, per length profile), this prints the makespan in lm-eval's order and,
over ``--orders`` random orders, the median and 5-95% range of their makespan against it.

    python benchmarks/bench_order_makespan.py OUTPUT/*/samples_TASK_*.jsonl [--concurrency 64]
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from probe.demo.simserver import answer_tokens  # noqa: E402


def makespan(lengths: list[int], places: int) -> int:
    """When the last answer ends, each started at the first free place, in the order given."""
    free = [0] * places
    end = 0
    for length in lengths:
        start = heapq.heappop(free)
        end = max(end, start + length)
        heapq.heappush(free, start + length)
    return end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("samples", type=Path, help="a --log_samples file of the run (its prompts)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--orders", type=int, default=200)
    parser.add_argument("--profiles", default="lognormal,reasoning")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.samples.read_text().splitlines()]
    pairs = [(r["arguments"]["gen_args_0"]["arg_0"], str(r["target"])) for r in rows]
    pairs.sort(key=lambda pair: (-len(pair[0]), pair[0]))  # lm-eval's order: longest prompt first
    for profile in args.profiles.split(","):
        lengths = [answer_tokens(prompt, profile, answer) for prompt, answer in pairs]
        base = makespan(lengths, args.concurrency)
        ratios = sorted(
            makespan(random.Random(seed).sample(lengths, len(lengths)), args.concurrency) / base
            for seed in range(args.orders)
        )
        low, high = ratios[len(ratios) // 20], ratios[len(ratios) * 19 // 20]
        print(
            f"{profile}: {len(lengths)} answers over {args.concurrency} places; makespan in lm-eval's order "
            f"{base:,} tokens; {args.orders} random orders against it: median {statistics.median(ratios):.4f}, "
            f"5-95% {low:.4f}-{high:.4f}"
        )


if __name__ == "__main__":
    main()
