"""Time and tokens to the verdict on lm-eval's in-process vLLM backend: unprobed, the cap rule, the detector.

The sibling of ``bench_verdict.py`` for ``--model vllm``: the engine runs inside lm-eval, so
there is no server to count for us. Each run is ``python -m lm_eval --model vllm`` in the vLLM
environment, with every prompt in one ``LLM.generate`` call (``--batch_size auto``);
``scripts/lm_eval_counted.py`` writes vLLM's own counters when lm-eval ends (tokens include the
partial tokens of aborted requests). Three never-stopping tiny Llamas (``scripts/tiny_llama.py``):
``never_stop``, which loops (one character a token, greedy); ``never_stop_wide``, the same loop
with a four-character token (a BPE token's size, and the loop detector's unit); and ``babble``,
which does not loop (random letters, sampled at temperature 1). For each, side by side:
unprobed; probed with today's cap rule alone (``HYPERLOOM_EVAL_PROBE_STREAM=off``: no partial
outputs are watched); probed with the degeneration detector on partial outputs (the defaults);
and, named in ``--runs``, those two without the engine's slow start (``cap_rule_wave``,
``detector_wave``: every prompt in the engine at once, as before it). For each run: tokens,
finished requests, wall time from start to exit; for the probed runs also the trip time (from the first
generate request, and from the start), its cause, the time from the trip to lm-eval's exit,
and the requests aborted in the engine at the trip.

The two ratios of issue 18, per model: time to the verdict over one full-length generation (the
cap rule's trip time: its verdict comes as the first wave of full-length generations ends), and
tokens to the verdict over MIN_SAMPLES x M (a probed run generates nothing after its trip: its
tokens are the tokens to the verdict).

    python benchmarks/bench_offline.py --vllm-python .venv-vllm/bin/python   # N=200, S=64, M=4096

The last line printed with --json is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from probe.demo.localtask import LocalTask, write_task  # noqa: E402
from probe.demo.servercounters import parse_vllm_metrics  # noqa: E402
from probe.reader.sidecar import read_sidecar  # noqa: E402
from probe.reader.verdict import classify  # noqa: E402
from probe.runtime.core.contract import ENV_SLOW_START, ENV_STREAM, Settings  # noqa: E402

# Each run and the probe's variables it sets: ``*_wave`` without the engine's slow start (every
# prompt in the engine at once, as before it), for the side-by-side figures.
KNOBS: dict[str, dict[str, str]] = {
    "unprobed": {},
    "cap_rule": {ENV_STREAM: "off"},
    "detector": {},
    "cap_rule_wave": {ENV_STREAM: "off", ENV_SLOW_START: "off"},
    "detector_wave": {ENV_SLOW_START: "off"},
}
RUNS = tuple(KNOBS)
# How each model is run: greedy as the task says, or sampled (babble only babbles when sampled).
SAMPLING = {"never_stop": "", "never_stop_wide": "", "babble": "temperature=1"}
PROMPT_ROOM = 512  # tokens of max_model_len kept for the prompt


def evaluate(args: argparse.Namespace, task: LocalTask, model: Path, work: Path, label: str) -> dict[str, Any]:
    """One run of ``label`` (RUNS) on ``model``, built in ``work``; its figures."""
    output, metrics = work / label, work / f"{label}.metrics.txt"
    arguments = task.lm_eval_vllm_arguments(
        model, output, args.max_tokens, args.max_num_seqs,
        max_model_len=args.max_tokens + PROMPT_ROOM, gen_kwargs=SAMPLING[model.name],
    )  # fmt: skip
    lm_eval = [args.vllm_python, str(ROOT / "scripts" / "lm_eval_counted.py"), str(metrics), "--", *arguments]
    probed = label != "unprobed"
    command = [sys.executable, "-m", "probe", "run", "--result-dir", str(output), "--", *lm_eval] if probed else lm_eval
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERLOOM_EVAL_PROBE") and k != "PYTHONPATH"}
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=str(ROOT))
    env.update(KNOBS[label])
    print(f"{model.name} {label}: lm-eval --model vllm (engine start-up takes about 30 s)...", file=sys.stderr)
    started = time.time()
    with (work / f"{label}.log").open("w") as log:
        code = subprocess.call(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    ended = time.time()
    if code != 0:
        raise SystemExit(f"{label} lm-eval run failed (exit {code}); see {work / (label + '.log')}")
    counters = parse_vllm_metrics(metrics.read_text())
    figures: dict[str, Any] = {
        "tokens": int(counters["generation_tokens"]),
        "finished": {k[len("finished_") :]: int(v) for k, v in counters.items() if k.startswith("finished_") and v},
        "wall_s": round(ended - started, 2),
        "verdict": classify(output, floor=0.01).status.value,
    }
    if probed:
        sidecar = read_sidecar(output)
        if sidecar.state != "valid":
            raise SystemExit(f"the {label} run left no valid sidecar ({sidecar.state}); see {work / (label + '.log')}")
        figures.update(trip_timing(sidecar.trip, sidecar.final or {}, started, ended))
        figures.update(
            cause=sidecar.trip.get("cause"),
            trip_after_start_s=round(sidecar.trip["tripped_at"] - started, 2),
            aborted_in_engine=(sidecar.final or {}).get("cancelled_in_flight"),
        )
    return figures


def trip_timing(trip: dict[str, Any], final: dict[str, Any], started: float, ended: float) -> dict[str, Any]:
    """When a probed run tripped (from its sidecar's trip record and final counters), against the
    process's ``started`` and ``ended`` times, and how many answers it made up."""
    return {
        "trip_s": trip["seconds_since_first_request"],
        # lm-eval's and the engine's start-up, the same in both runs: what the probe cannot save
        "start_up_s": round(trip["tripped_at"] - started - trip["seconds_since_first_request"], 2),
        "exit_after_trip_s": round(ended - trip["tripped_at"], 2),
        "blank_answers": final.get("short_circuited_requests"),
    }


def never_stopping_setup(python: str, prefix: str, n: int, variant: str = "never_stop") -> tuple[Path, Path, LocalTask]:
    """A new work directory, the never-stopping tiny Llama ``variant`` built in it by ``python``,
    and the local task of ``n`` documents."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    model = work / variant
    subprocess.run([python, str(ROOT / "scripts" / "tiny_llama.py"), str(model), "--variant", variant],
                   check=True, capture_output=True)  # fmt: skip
    return work, model, write_task(work / "task", n)


def ratios(runs: dict[str, Any], min_samples: int, max_tokens: int) -> dict[str, Any]:
    """Issue 18's two ratios for the probed runs of one model (see the module's docstring)."""
    full_length_s = runs["cap_rule"]["trip_s"]
    return {
        label: {
            "time_to_verdict_over_full_length": round(runs[label]["trip_s"] / full_length_s, 4),
            "tokens_to_verdict_over_min_samples_x_m": round(runs[label]["tokens"] / (min_samples * max_tokens), 4),
        }
        for label in RUNS
        if label != "unprobed" and label in runs
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="documents")
    parser.add_argument("--max-tokens", type=int, default=4096, help="max_gen_toks per request")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="vLLM's max_num_seqs: requests at once")
    parser.add_argument("--models", default=",".join(SAMPLING), help=f"comma-separated, of {', '.join(SAMPLING)}")
    parser.add_argument(
        "--runs", default="unprobed,cap_rule,detector", help=f"comma-separated, of {', '.join(RUNS)} (cap_rule first)"
    )
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args()
    labels = [label for label in RUNS if label in args.runs.split(",")]
    min_samples = Settings().min_samples
    result: dict[str, Any] = {
        "backend": "vllm (in-process)", "n": args.n, "max_num_seqs": args.max_num_seqs,
        "max_tokens": args.max_tokens, "min_samples": min_samples, "models": {},
    }  # fmt: skip
    for variant in args.models.split(","):
        work, model, task = never_stopping_setup(args.vllm_python, f"bench-offline-{variant}-", args.n, variant)
        runs = {label: evaluate(args, task, model, work, label) for label in labels}
        if "cap_rule" in runs:
            runs["ratios"] = ratios(runs, min_samples, args.max_tokens)
        result["models"][variant] = runs
        print(_report(result, variant))
    if args.json:
        print(json.dumps(result))


def _report(r: dict[str, Any], variant: str) -> str:
    runs = r["models"][variant]
    lines = [f"lm-eval --model vllm, {variant}: N={r['n']}, max_num_seqs={r['max_num_seqs']}, M={r['max_tokens']}"]
    for label in RUNS:
        if label not in runs:
            continue
        f = runs[label]
        lines.append(
            f"  {label}: {f['tokens']:,} tokens, finished {f['finished']}, {f['wall_s']} s, verdict {f['verdict']}"
        )
        if label != "unprobed":
            lines.append(
                f"    trip ({f['cause']}) {f['trip_s']} s after the first generate request "
                f"({f['trip_after_start_s']} s after the start, {f['start_up_s']} s of it start-up); "
                f"lm-eval exited {f['exit_after_trip_s']} s after the trip; "
                f"aborted in the engine: {f['aborted_in_engine']}; blank answers: {f['blank_answers']}"
            )
    for label, ratio in runs.get("ratios", {}).items():
        lines.append(
            f"  {label}: time to the verdict {ratio['time_to_verdict_over_full_length']} x one full-length generation, "
            f"tokens {ratio['tokens_to_verdict_over_min_samples_x_m']} x MIN_SAMPLES x M"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
