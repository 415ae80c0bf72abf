"""Run lm-eval's command line in this process, then write vLLM's own counters to a file.

With lm-eval's in-process backend (``--model vllm``) there is no server whose ``/metrics``
could be read afterwards; vLLM keeps the same Prometheus counters in the process that
drives its engine, when lm-eval's ``--model_args`` carry ``disable_log_stats=False``.
This writes them (Prometheus text, as ``/metrics`` serves it) when lm-eval ends, whatever
its outcome, and exits with lm-eval's exit status. Run with the vLLM environment's Python:

    python scripts/lm_eval_counted.py METRICS.txt -- --model vllm --model_args ... --tasks ...
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        sys.exit(__doc__)
    metrics = Path(sys.argv[1])
    sys.argv = ["lm_eval", *sys.argv[3:]]
    try:
        runpy.run_module("lm_eval", run_name="__main__", alter_sys=True)
    finally:
        from prometheus_client import REGISTRY, generate_latest

        metrics.write_bytes(generate_latest(REGISTRY))


if __name__ == "__main__":
    main()
