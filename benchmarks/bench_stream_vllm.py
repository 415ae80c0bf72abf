"""What watching the streams costs a run on real vLLM: generation span, probed against unprobed.

vLLM's CPU build serves a tiny Llama (``scripts/tiny_llama.py``); lm-eval evaluates a local
task against it through a pass-through proxy (``countingproxy``) that records when each
generate request arrived and when its reply ended. Three arms, alternated ``--reps`` times in
one run: unprobed; probed with every evidence request streamed and read by the loop detector
(``HYPERLOOM_EVAL_PROBE_STREAM=on``); probed with nothing streamed (``off``: the probe's gate
and order alone). The rule is kept from firing (``MIN_SAMPLES`` above the requests), so every
request runs as it would unprobed and every answer is compared. The span is from the first
generate request to the last reply, the part of a run the probe can slow; the ratio is the
median probed span over the median unprobed span.

The tiny Llamas that vLLM can serve here do not give healthy answer lengths that vary (lm-eval
sends every request the same sampling seed): ``never_stop_wide`` (the default) answers every
prompt with its one four-character token to ``--max-tokens``, a loop the detector flags in each
stream without a trip, so the streamed arm pays for the parsing, the reassembly and the
detector on every token: a worst case for the detector, at equal lengths (the order of the
requests then costs nothing).

    python benchmarks/bench_stream_vllm.py --vllm-python .venv-vllm/bin/python [--n 200]
        [--concurrency 64] [--max-tokens 512] [--reps 3] [--json]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
import vllm_server  # noqa: E402
from countingproxy import CountingProxy  # noqa: E402

from probe.demo.localtask import write_task  # noqa: E402
from probe.inject import sitecustomize_text  # noqa: E402
from probe.runtime.contract import ENV_MIN_SAMPLES, ENV_STREAM  # noqa: E402

ARMS: dict[str, dict[str, str] | None] = {
    "unprobed": None,
    "streamed": {ENV_STREAM: "on"},
    "stream_off": {ENV_STREAM: "off"},
}


def answers(output: Path) -> list[Any]:
    (samples,) = output.glob("*/samples_*.jsonl")
    rows = sorted((json.loads(line) for line in samples.read_text().splitlines()), key=lambda r: r["doc_id"])
    return [r["resps"] for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--n", type=int, default=200, help="documents")
    parser.add_argument("--concurrency", type=int, default=64, help="num_concurrent")
    parser.add_argument("--max-tokens", type=int, default=512, help="max_tokens per request")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="end with one JSON line of the figures")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-stream-vllm-"))
    model = work / "never_stop_wide"
    subprocess.run([args.vllm_python, str(ROOT / "scripts" / "tiny_llama.py"), str(model), "--variant",
                    "never_stop_wide"], check=True, capture_output=True)  # fmt: skip
    task = write_task(work / "task", args.n)
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize_text(chain=True))
    print("starting vLLM (about a minute)...", file=sys.stderr)
    server = vllm_server.start(model, "m", args.vllm_python, log=work / "vllm.log", max_model_len=args.max_tokens + 512)
    proxy = CountingProxy(server.base_url).start()
    spans: dict[str, list[float]] = {arm: [] for arm in ARMS}
    given: dict[str, list[Any]] = {}
    try:
        for rep in range(args.reps):
            for arm, knobs in ARMS.items():
                output = work / f"{arm}-{rep}"
                command = task.lm_eval_command(
                    proxy.base_url, "m", output, args.max_tokens, args.concurrency, "--log_samples"
                )
                env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERLOOM_EVAL_PROBE")}
                env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", RESULT_DIR=str(output))
                env["PYTHONPATH"] = str(site) if knobs is not None else ""
                env.update({ENV_MIN_SAMPLES: str(10 * args.n), **(knobs or {})})
                seen = len(proxy.times)
                print(f"rep {rep + 1}/{args.reps}: {arm}...", file=sys.stderr)
                subprocess.run(command, env=env, check=True, capture_output=True)
                time.sleep(0.5)  # the proxy records a reply's end after passing it on
                spans[arm].append(max(proxy.ended[seen:]) - proxy.times[seen])
                given.setdefault(arm, answers(output))
                if answers(output) != given[arm]:
                    raise SystemExit(f"{arm}: the answers changed between repetitions (greedy, deterministic)")
    finally:
        proxy.stop()
        vllm_server.stop(server.pid)
    base = statistics.median(spans["unprobed"])
    result = {
        "server": "vllm (CPU), never_stop_wide",
        "n": args.n,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "reps": args.reps,
        "arms": {
            arm: {
                "span_s": [round(s, 2) for s in spans[arm]],
                "span_ratio_median": round(statistics.median(spans[arm]) / base, 4),
                "identical_answers": given[arm] == given["unprobed"],
            }
            for arm in ARMS
        },
    }
    print(f"vLLM, N={args.n}, C={args.concurrency}, M={args.max_tokens}, {args.reps} reps:")
    for arm, figures in result["arms"].items():
        print(f"  {arm}: spans {figures['span_s']} s, median ratio {figures['span_ratio_median']}, "
              f"identical answers {figures['identical_answers']}")  # fmt: skip
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
