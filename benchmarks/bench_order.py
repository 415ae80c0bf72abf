"""Does the rule judge a uniform sample when cap-hitting follows prompt length?

lm-eval sends a group's requests longest prompt first. Here the simulated server runs the
longest ``--shares`` of ``--n`` prompts to the cap and stops on the rest, so judged in
lm-eval's order the first ``MIN_SAMPLES`` observations are all at the cap. For each share,
real lm-eval (``LocalCompletionsAPI.generate_until``, in this process, over HTTP) runs the
prompts with the probe installed, once per seed of the probe's sampling, on the async path
with the slow start on and off (``--concurrency``) and on the sync path (num_concurrent=1).
Each run records whether the group tripped. Compared with:

- the exact probability that the rule fires when the ``n`` observations come in a uniform
  random order (``K = share * n`` of them at the cap; dynamic programming over looks), and
- bench_rule.py's table: observations at the cap independently with probability ``share``
  (the table in docs/rule.md, which assumes random order), for ``n`` looks;
- lm-eval's own order (longest first), where the rule's decision is fixed: computed by
  feeding the observations in that order through the probe's ``Tally``.

The measured rate comes with its 95% Wilson interval over the seeds.

    python benchmarks/bench_order.py [--n 200] [--shares 0.2,0.5] [--seeds 200] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_rule import first_fire_distribution  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.openai_completions import LocalCompletionsAPI  # noqa: E402

from probe.demo.simserver import SimServer  # noqa: E402
from probe.runtime import install, state  # noqa: E402
from probe.runtime.core.contract import ENV_SLOW_START, Settings  # noqa: E402
from probe.runtime.core.evidence import Tally  # noqa: E402
from probe.runtime.core.rule import rule_fires  # noqa: E402
from probe.runtime.core.sampling import Sampling  # noqa: E402
from probe.runtime.scope.gate import Gates  # noqa: E402

GEN_KWARGS = {"until": ["\n\n"], "max_tokens": 2048, "temperature": 0}


def questions(n: int) -> list[str]:
    """Arithmetic questions, each longer than the one before."""
    return [f"Question{' .' * i}: What is {i} + {2 * i + 1}?\nAnswer:" for i in range(n)]


def random_order_fire(n: int, caps: int, min_samples: int, ratio: float) -> float:
    """P(the rule ever fires) when ``n`` observations, ``caps`` at the cap, come in uniform random order."""
    alive = {0: 1.0}  # caps seen so far -> probability, not fired yet
    fired = 0.0
    for looks in range(1, n + 1):
        step: dict[int, float] = {}
        for k, mass in alive.items():
            left, left_caps = n - (looks - 1), caps - k
            if left_caps:
                step[k + 1] = step.get(k + 1, 0.0) + mass * left_caps / left
            if left - left_caps:
                step[k] = step.get(k, 0.0) + mass * (left - left_caps) / left
        for k in list(step):
            if rule_fires(looks, k, min_samples, ratio):
                fired += step.pop(k)
        alive = step
    return fired


def lm_eval_order_fires(n: int, caps: int, settings: Settings) -> int | None:
    """The look at which the rule fires on lm-eval's order (longest, i.e. at the cap, first), or None."""
    tally = Tally()
    for look in range(1, n + 1):
        tally.add(["length" if look <= caps else "stop"], 2048)
        if tally.fires(settings):
            return look
    return None


def wilson(hits: int, trials: int, z: float = 1.96) -> tuple[float, float]:
    if not trials:
        return 0.0, 1.0
    p = hits / trials
    centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
    return max(0.0, centre - half), min(1.0, centre + half)


def probed_run(url: str, texts: list[str], concurrency: int, seed: int, result_dir: Path) -> dict[str, Any]:
    """One probed generate_until of ``texts`` with the sampling seed ``seed``: tripped, and how many sent."""
    os.environ["RESULT_DIR"] = str(result_dir)
    assert install.install()
    try:
        probe = state.ACTIVE
        assert probe is not None
        probe.gates = Gates(probe.settings, Sampling(seed))
        lm = LocalCompletionsAPI(
            base_url=url, model="sim", num_concurrent=concurrency, batch_size=1, tokenizer_backend=None,
            tokenized_requests=False, max_retries=2,
        )  # fmt: skip
        requests = [
            Instance(request_type="generate_until", doc={}, arguments=(t, dict(GEN_KWARGS)), idx=i)
            for i, t in enumerate(texts)
        ]
        lm.generate_until(requests, disable_tqdm=True)
        group = next(iter(probe.groups))
        return {"tripped": group.tripped, "observations": group.tally.observed}
    finally:
        install.uninstall()


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    texts = questions(args.n)
    settings = Settings()
    arms = [(f"async C={args.concurrency}, slow start on", args.concurrency, "on"),
            (f"async C={args.concurrency}, slow start off", args.concurrency, "off"),
            ("sync (num_concurrent=1)", 1, "off")]  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for share in args.shares:
            caps = round(share * args.n)
            threshold = sorted(len(t) for t in texts)[args.n - caps]
            server = SimServer("mixed", cap_min_chars=threshold).start()
            try:
                assert sum(server.at_cap(t) for t in texts) == caps
                for name, concurrency, slow in arms:
                    os.environ[ENV_SLOW_START] = slow
                    tripped = 0
                    for seed in tqdm(range(args.seeds), desc=f"share={share} {name}", file=sys.stderr):
                        outcome = probed_run(f"{server.base_url}/v1/completions", texts, concurrency, seed,
                                             Path(work) / f"{share}-{concurrency}-{slow}-{seed}")  # fmt: skip
                        tripped += outcome["tripped"]
                    low, high = wilson(tripped, args.seeds)
                    table = sum(first_fire_distribution(share, args.n, settings.min_samples, settings.length_ratio))
                    rows.append({
                        "share": share, "arm": name, "seeds": args.seeds, "tripped": tripped,
                        "rate": tripped / args.seeds, "wilson95": [low, high],
                        "exact_random_order": random_order_fire(args.n, caps, settings.min_samples,
                                                                settings.length_ratio),
                        "table_binomial": table,
                        "lm_eval_order_fires_at": lm_eval_order_fires(args.n, caps, settings),
                    })  # fmt: skip
            finally:
                server.stop()
                os.environ.pop(ENV_SLOW_START, None)
    return rows


def _p(value: float) -> str:
    return "<1e-12" if value < 1e-12 else f"{value:.2e}" if value < 0.001 else f"{value:.3f}"


def markdown(rows: list[dict[str, Any]], n: int) -> str:
    lines = [
        f"Trip rate of a model whose answers at the cap are all on the longest prompts (N={n} prompts, "
        "defaults MIN_SAMPLES=16, LENGTH_RATIO=0.75):",
        "",
        "| at the cap | path | seeds | tripped | rate (95% interval) | exact, random order | table (binomial) "
        "| lm-eval's order |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        low, high = r["wilson95"]
        fires = r["lm_eval_order_fires_at"]
        order = f"trips at observation {fires}" if fires else "never trips"
        lines.append(
            f"| {r['share']:.0%} | {r['arm']} | {r['seeds']} | {r['tripped']} | {r['rate']:.3f} "
            f"({low:.3f}-{high:.3f}) | {_p(r['exact_random_order'])} | {_p(r['table_binomial'])} | {order} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="prompts per run")
    parser.add_argument("--shares", type=lambda s: [float(x) for x in s.split(",")], default=[0.2, 0.5])
    parser.add_argument("--seeds", type=int, default=200, help="runs (sampling seeds) per share and path")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args)
    print(markdown(rows, args.n))
    if args.json:
        print(json.dumps({"n": args.n, "rows": rows}))


if __name__ == "__main__":
    main()
