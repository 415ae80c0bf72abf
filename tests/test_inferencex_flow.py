"""The InferenceX flow end to end: the patched `_patch_lm_eval`, lm-eval at two concurrencies,
InferenceX's staging renames, meta_env.json, then `eval-probe read` on the staged directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from support.procs import PYTHON

from probe.demo.localtask import offline_env, write_task
from probe.runtime import contract

FIXTURE = Path(__file__).parent / "fixtures" / "file"

# One lm-eval run as run_lm_eval makes it: chat completions, the chat template, --log_samples.
RUN = """
source "$LIB" && _patch_lm_eval || exit 1
for point in "8 $HEALTHY" "16 $BROKEN"; do
    set -- $point
    out="$WORK/lm_eval_out"
    args="model=sim,base_url=$2/v1/chat/completions,num_concurrent=$1,tokenized_requests=False,max_retries=2"
    EVAL_RESULT_DIR="$out" "$PYTHON" -m lm_eval --model local-chat-completions --apply_chat_template \\
        --model_args "$args" \\
        --tasks "$TASK" --output_path "$out" --log_samples --gen_kwargs max_tokens=4096,temperature=0,top_p=1 \\
        || exit 1
    (cd "$WORK" && _stage_lm_eval_artifacts "$out" "$1") || exit 1
done
"""


def test_inferencex_flow_gives_one_set_of_verdicts_per_concurrency(sim, tmp_path) -> None:
    tree = tmp_path / "InferenceX"
    shutil.copytree(FIXTURE, tree)
    lib = tree / "benchmarks" / "benchmark_lib.sh"
    patched = subprocess.run([PYTHON, "-m", "probe", "patch", str(lib)], capture_output=True, text=True)
    assert patched.returncode == 0, patched.stderr
    healthy, broken = sim("healthy"), sim("never_stop")
    work, results = tmp_path / "workspace", tmp_path / "results"
    work.mkdir()
    task = write_task(tmp_path / "task", 24)
    env = offline_env(None, LIB=str(lib), WORK=str(work), TASK=str(task.yaml), PYTHON=PYTHON,
                      HEALTHY=healthy.base_url, BROKEN=broken.base_url, RESULT_DIR=str(results),
                      PATH=os.environ["PATH"])  # fmt: skip
    run = subprocess.run(["bash", "-c", RUN], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (work / "meta_env.json").write_text(json.dumps({"eval_concs": [8, 16], "completed_eval_concs": [8, 16],
                                                    "failed_eval_concs": []}))  # fmt: skip
    staged = sorted(p.name for p in work.iterdir())
    assert any(n.startswith("results_") and n.endswith("_conc16.json") for n in staged), staged
    assert (results / contract.SIDECAR_NAME).exists()  # RESULT_DIR, as InferenceX's CI sets it

    read = subprocess.run([PYTHON, "-m", "probe", "read", str(work), "--json"], capture_output=True, text=True)
    verdicts = json.loads(read.stdout)
    assert read.returncode == 1, read.stdout
    assert [(v["concurrency"], v["task"], v["status"]) for v in verdicts] == [
        (8, task.name, "ok"),
        (16, task.name, "below_floor"),
    ]
    assert verdicts[1]["cause"] == "non-termination: cut short" and verdicts[1]["evidence"]["cut_off"] >= 16
    table = subprocess.run([PYTHON, "-m", "probe", "read", str(work)], capture_output=True, text=True).stdout
    # Each block names its results file and run, with the concurrency.
    for verdict in verdicts:
        assert f"{verdict['results_file']} (run {verdict['run_id']}" in table
        assert f"concurrency {verdict['concurrency']}" in table


def test_a_concurrency_inferencex_records_as_failed_is_unavailable(tmp_path) -> None:
    (tmp_path / "meta_env.json").write_text(json.dumps({"eval_concs": [8, 16], "failed_eval_concs": [16]}))
    read = subprocess.run([PYTHON, "-m", "probe", "read", str(tmp_path), "--json"], capture_output=True, text=True)
    verdicts = json.loads(read.stdout)
    assert read.returncode == 2
    assert [(v["concurrency"], v["status"]) for v in verdicts] == [(8, "unavailable"), (16, "unavailable")]
    assert "no results file for concurrency 8" in verdicts[0]["reason"] and "failed" in verdicts[1]["reason"]
