"""A long-lived process (a training loop that evaluates every N steps, a checkpoint sweep, a
notebook) runs many probed evaluations: what an ended evaluation leaves behind is its small
evidence document, never its prompts."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest
from support.procs import PYTHON, probe_site

from probe.demo.localtask import offline_env, write_task

DOCS, PAD, EVALUATIONS, TRACED = 40, 25_000, 5, 3

# Each evaluation loads the task afresh and runs it; memory is traced (slow) over the last few only.
_LOOP = """
import gc, json, sys, tracemalloc
import lm_eval
try:  # a task's YAML as a config, the way each release's own command line loads it
    from lm_eval.utils import load_yaml_config
except ImportError:
    from lm_eval.tasks._yaml_loader import load_yaml as load_yaml_config
sizes = []
for i in range(int(sys.argv[3])):
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"model=sim,base_url={sys.argv[2]}/v1/completions,num_concurrent=8,tokenized_requests=False,"
        "tokenizer_backend=None,max_retries=2",
        tasks=[load_yaml_config(sys.argv[1])], gen_kwargs="max_tokens=64",
    )
    assert results["hyperloom_eval_probe"]["tasks"], "the evaluation was not probed"
    del results
    gc.collect()
    if i == int(sys.argv[3]) - int(sys.argv[4]) - 1:
        tracemalloc.start()
    if tracemalloc.is_tracing():
        sizes.append(tracemalloc.get_traced_memory()[0])
scopes = [o for o in gc.get_objects() if type(o).__name__ == "Probe" and type(o).__module__.endswith(".state")]
print(json.dumps({"sizes": sizes, "live_scopes": len(scopes)}))
"""


@pytest.mark.slow  # five whole evaluations, three of them traced: about 75 s
def test_memory_is_flat_over_many_probed_evaluations_in_one_process(sim, tmp_path: Path) -> None:
    task = write_task(tmp_path / "task", DOCS)
    # Each prompt carries PAD characters of its own: about DOCS * PAD bytes of prompts an evaluation.
    rows = [json.loads(line) for line in (task.yaml.parent / f"{task.yaml.stem}.jsonl").read_text().splitlines()]
    with (task.yaml.parent / f"{task.yaml.stem}.jsonl").open("w") as handle:
        for i, row in enumerate(rows):
            handle.write(json.dumps({**row, "pad": f"{i:05d}" + "x" * PAD}) + "\n")
    yaml = task.yaml.read_text()
    task.yaml.write_text(yaml.replace('doc_to_text: "', 'doc_to_text: "{{pad}} ', 1))
    server = sim("healthy")
    command = [PYTHON, "-c", _LOOP, str(task.yaml), server.base_url, str(EVALUATIONS), str(TRACED)]
    run = subprocess.run(command, env=offline_env(probe_site(tmp_path / "site")), capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    measured = json.loads(run.stdout.splitlines()[-1])
    assert server.snapshot()["generate_requests"] == DOCS * EVALUATIONS
    # Only the last evaluation's scope may still be alive (none: each is let go when it ends).
    assert measured["live_scopes"] <= 1, measured
    # lm-eval itself keeps about 4 MB once, in one of the evaluations: the median is the steady growth.
    # (Unprobed, lm-eval keeps up to about 0.1 MB in an evaluation: a leak of the prompts is 1 MB each.)
    growths = sorted(after - before for before, after in itertools.pairwise(measured["sizes"]))
    assert growths[len(growths) // 2] < DOCS * PAD / 4, measured
