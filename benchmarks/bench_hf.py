"""Tokens and wall time on lm-eval's Hugging Face backend (``--model hf``), unprobed and probed.

Three runs of ``python -m lm_eval --model hf`` on CPU, on the never-stopping tiny Llama
(``scripts/tiny_llama.py``) and the local task, side by side: unprobed; probed; and probed
with a rule that cannot fire (``MIN_SAMPLES`` above the number of documents), which watches
every decoding step of every batch to the end and so measures what watching costs.
``scripts/lm_eval_hf_counted.py`` counts what transformers generated: decoding steps times
the rows of each batch, and the padding in the prompts of each batch. For each run: tokens,
padding, wall time from start to exit; for the tripping run also the trip time (from the
first generate request), the start-up before it, and the blank answers. The probed runs
generate lm-eval's own batches in the probe's seeded order of whole batches, the unprobed one
in lm-eval's longest-first order: the padding of the watching run should equal the unprobed
run's, and its wall time against the unprobed one is what the order and the watching cost.

    .venv-lm-eval-0.4.9.2/bin/python benchmarks/bench_hf.py --n 64 --max-tokens 128   # defaults: N=200, M=256, batch 8

The last line printed with --json is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_offline import never_stopping_setup, trip_timing  # noqa: E402
from probe.demo.localtask import LocalTask  # noqa: E402
from probe.reader.sidecar import read_sidecar  # noqa: E402
from probe.runtime.core import contract  # noqa: E402

RUNS = ("unprobed", "probed", "watching")


def evaluate(args: argparse.Namespace, task: LocalTask, model: Path, work: Path, label: str) -> dict[str, Any]:
    output, counts = work / label, work / f"{label}.counts.json"
    lm_eval = [
        args.hf_python, str(ROOT / "scripts" / "lm_eval_hf_counted.py"), str(counts), "--",
        "--model", "hf", "--model_args", f"pretrained={model},dtype=float32", "--device", "cpu",
        "--tasks", str(task.yaml), "--batch_size", str(args.batch_size),
        "--gen_kwargs", f"max_gen_toks={args.max_tokens}", "--output_path", str(output),
    ]  # fmt: skip
    probed = label != "unprobed"
    command = [sys.executable, "-m", "probe", "run", "--result-dir", str(output), "--", *lm_eval] if probed else lm_eval
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERLOOM_EVAL_PROBE") and k != "PYTHONPATH"}
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    env[contract.ENV_MIN_MAX_TOKENS] = "0"  # the tiny model's budget is below the default
    if label == "watching":
        env[contract.ENV_MIN_SAMPLES] = str(args.n + 1)
    print(f"{label}: lm-eval --model hf...", file=sys.stderr)
    started = time.time()
    with (work / f"{label}.log").open("w") as log:
        code = subprocess.call(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    ended = time.time()
    if code != 0:
        raise SystemExit(f"{label} lm-eval run failed (exit {code}); see {work / (label + '.log')}")
    figures: dict[str, Any] = {**json.loads(counts.read_text()), "wall_s": round(ended - started, 2)}
    sidecar = read_sidecar(output)
    figures["tripped"] = sidecar.state == "valid"
    if sidecar.state == "valid":
        figures.update(trip_timing(sidecar.trip, sidecar.final or {}, started, ended))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="documents")
    parser.add_argument("--max-tokens", type=int, default=256, help="max_gen_toks per request")
    parser.add_argument("--batch-size", type=int, default=8, help="lm-eval's --batch_size")
    parser.add_argument("--hf-python", default=str(ROOT / ".venv-lm-eval-0.4.9.2" / "bin" / "python"))
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args()
    work, model, task = never_stopping_setup(args.hf_python, "bench-hf-", args.n)
    result: dict[str, Any] = {
        "backend": "hf",
        "n": args.n,
        "max_tokens": args.max_tokens,
        "batch_size": args.batch_size,
    }
    for label in RUNS:
        result[label] = evaluate(args, task, model, work, label)
    print(_report(result))
    if args.json:
        print(json.dumps(result))


def _report(r: dict[str, Any]) -> str:
    u, p, w = (r[label] for label in RUNS)
    return "\n".join([
        f"lm-eval --model hf: N={r['n']}, M={r['max_tokens']}, batch size {r['batch_size']}",
        f"  unprobed: {u['generated_tokens']:,} tokens in {u['generate_calls']} batches, {u['wall_s']} s; "
        f"padding {u['padding_positions']:,} of {u['prompt_positions']:,} prompt positions",
        f"  probed:   {p['generated_tokens']:,} tokens in {p['generate_calls']} batches, {p['wall_s']} s; trip "
        f"{p['trip_s']} s after the first generate request ({p['start_up_s']} s of start-up before it); "
        f"lm-eval exited {p['exit_after_trip_s']} s after the trip; blank answers: {p['blank_answers']}",
        f"  watching, rule unable to fire: {w['generated_tokens']:,} tokens, {w['wall_s']} s, tripped: {w['tripped']}; "
        f"padding {w['padding_positions']:,} of {w['prompt_positions']:,} prompt positions",
        f"  token saving: {1 - p['generated_tokens'] / u['generated_tokens']:.1%}; wall-time saving: "
        f"{1 - p['wall_s'] / u['wall_s']:.1%}; cost of watching every step: {w['wall_s'] / u['wall_s'] - 1:+.1%}",
    ])  # fmt: skip


if __name__ == "__main__":
    main()
