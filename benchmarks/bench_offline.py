"""Time and tokens to the verdict on lm-eval's in-process vLLM backend, unprobed then probed.

The sibling of ``bench_verdict.py`` for ``--model vllm``: the engine runs inside lm-eval, so
there is no server to count for us. Each run is ``python -m lm_eval --model vllm`` on the
never-stopping tiny Llama (``scripts/tiny_llama.py``) in the vLLM environment, with every
prompt in one ``LLM.generate`` call (``--batch_size auto``); ``scripts/lm_eval_counted.py``
writes vLLM's own counters when lm-eval ends (tokens include the partial tokens of aborted
requests). For each run: tokens, finished requests, wall time from start to exit; for the
probed run also the trip time (from the first generate request, and from the start), the
time from the trip to lm-eval's exit, and the requests aborted in the engine at the trip.

    python benchmarks/bench_offline.py --vllm-python .venv-vllm/bin/python   # N=200, S=64, M=1024

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


def evaluate(args: argparse.Namespace, task: LocalTask, model: Path, work: Path, label: str) -> dict[str, Any]:
    output, metrics = work / label, work / f"{label}.metrics.txt"
    arguments = task.lm_eval_vllm_arguments(model, output, args.max_tokens, args.max_num_seqs)
    lm_eval = [args.vllm_python, str(ROOT / "scripts" / "lm_eval_counted.py"), str(metrics), "--", *arguments]
    probed = label == "probed"
    command = [sys.executable, "-m", "probe", "run", "--result-dir", str(output), "--", *lm_eval] if probed else lm_eval
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERLOOM_EVAL_PROBE") and k != "PYTHONPATH"}
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1", PYTHONPATH=str(ROOT))
    print(f"{label}: lm-eval --model vllm (engine start-up takes about 30 s)...", file=sys.stderr)
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
            raise SystemExit(f"the probed run left no valid sidecar ({sidecar.state}); see {work / 'probed.log'}")
        figures.update(trip_timing(sidecar.trip, sidecar.final or {}, started, ended))
        figures.update(
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


def never_stopping_setup(python: str, prefix: str, n: int) -> tuple[Path, Path, LocalTask]:
    """A new work directory, the never-stopping tiny Llama built in it by ``python``, and the
    local task of ``n`` documents."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    model = work / "never_stop"
    subprocess.run([python, str(ROOT / "scripts" / "tiny_llama.py"), str(model), "--variant", "never_stop"],
                   check=True, capture_output=True)  # fmt: skip
    return work, model, write_task(work / "task", n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200, help="documents")
    parser.add_argument("--max-tokens", type=int, default=1024, help="max_gen_toks per request")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="vLLM's max_num_seqs: requests at once")
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args()
    work, model, task = never_stopping_setup(args.vllm_python, "bench-offline-", args.n)
    result = {
        "backend": "vllm (in-process)",
        "n": args.n,
        "max_num_seqs": args.max_num_seqs,
        "max_tokens": args.max_tokens,
        "unprobed": evaluate(args, task, model, work, "unprobed"),
        "probed": evaluate(args, task, model, work, "probed"),
    }
    print(_report(result))
    if args.json:
        print(json.dumps(result))


def _report(r: dict[str, Any]) -> str:
    u, p = r["unprobed"], r["probed"]
    return "\n".join([
        f"lm-eval --model vllm: N={r['n']}, max_num_seqs={r['max_num_seqs']}, M={r['max_tokens']}",
        f"  unprobed: {u['tokens']:,} tokens, finished {u['finished']}, {u['wall_s']} s, verdict {u['verdict']}",
        f"  probed:   {p['tokens']:,} tokens, finished {p['finished']}, {p['wall_s']} s, verdict {p['verdict']}",
        f"  trip {p['trip_s']} s after the first generate request ({p['trip_after_start_s']} s after the start, "
        f"{p['start_up_s']} s of it start-up); lm-eval exited {p['exit_after_trip_s']} s after the trip",
        f"  aborted in the engine at the trip: {p['aborted_in_engine']}; blank answers: {p['blank_answers']}",
        f"  token saving: {1 - p['tokens'] / u['tokens']:.1%}; wall-time saving: {1 - p['wall_s'] / u['wall_s']:.1%}"
        f" ({1 - (p['wall_s'] - p['start_up_s']) / (u['wall_s'] - p['start_up_s']):.1%} after start-up)",
    ])  # fmt: skip


if __name__ == "__main__":
    main()
