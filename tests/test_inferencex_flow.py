"""InferenceX's flow end to end, against the lm-eval InferenceX installs: the patched
`benchmark_lib.sh`, its own `_patch_lm_eval` and `run_lm_eval` (chat completions, two tasks in
one run) at two concurrencies, the staging renames, meta_env.json, then `eval-probe read` on the
staged directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.inferencex import FIXTURES, patched_site
from support.procs import PYTHON

from patcher.markers import SITECUSTOMIZE
from probe.demo.localtask import COUNT_MARKER, SECOND_TASK, TASK, offline_env, write_task
from probe.runtime.core import contract

# InferenceX installs InferenceX's lm-eval (b315ef3), or leaves 0.4.13 when that reinstall fails:
# scripts/test.sh runs these against those two.
pytestmark = pytest.mark.inferencex

# Its benchmark scripts source the library, then call run_lm_eval once per concurrency.
RUN = """
source "$LIB" || exit 1
cd "$WORK" || exit 1
for CONC in 8 16; do
    run_lm_eval || exit 1
done
"""


def eval_probe(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "probe", *args], capture_output=True, text=True, timeout=120)


def test_run_lm_eval_gives_one_set_of_verdicts_per_concurrency_and_task(sim, tmp_path: Path) -> None:
    lib = tmp_path / "InferenceX" / "benchmarks" / "benchmark_lib.sh"
    shutil.copytree(FIXTURES / "file", tmp_path / "InferenceX")
    patched = eval_probe("patch", str(lib))
    assert patched.returncode == 0, patched.stderr
    # One server for both tasks: it answers the arithmetic and never stops on the counting.
    server = sim("healthy", loop_marker=COUNT_MARKER)
    tasks, work, results = tmp_path / "tasks", tmp_path / "workspace", tmp_path / "results"
    arith, count = write_task(tasks, 24, TASK), write_task(tasks, 24, SECOND_TASK)
    work.mkdir()
    env = offline_env(None, LIB=str(lib), WORK=str(work), MODEL="sim", PORT=str(server.port),
                      EVAL_TASKS_DIR=str(tasks), EVAL_INCLUDE_PATH=str(tasks), RESULT_DIR=str(results),
                      PATH=f"{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}")  # fmt: skip
    run = subprocess.run(["bash", "-c", RUN], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stderr.count("[lm-eval-probe] tripped") == 2  # once per concurrency, on the counting
    (work / "meta_env.json").write_text(json.dumps({"eval_concs": [8, 16], "completed_eval_concs": [8, 16],
                                                    "failed_eval_concs": []}))  # fmt: skip
    staged = sorted(p.name for p in work.iterdir())
    for conc in (8, 16):
        assert any(n.startswith("results_") and n.endswith(f"_conc{conc}.json") for n in staged), staged
        assert any(n.startswith(f"samples_{count.name}_") and n.endswith(f"_conc{conc}.jsonl") for n in staged)
    assert (results / contract.SIDECAR_NAME).exists()  # RESULT_DIR, as InferenceX's CI sets it

    read = eval_probe("read", str(work), "--json")
    verdicts = json.loads(read.stdout)
    assert read.returncode == 1, read.stdout
    assert [(v["concurrency"], v["task"], v["status"]) for v in verdicts] == [
        (8, arith.name, "ok"),
        (8, count.name, "below_floor"),
        (16, arith.name, "ok"),
        (16, count.name, "below_floor"),
    ]
    for verdict in verdicts[1::2]:
        assert verdict["cause"] == "non-termination: cut short" and verdict["evidence"]["cut_off"] >= 16
    table = eval_probe("read", str(work)).stdout
    # Each block names its results file and run, with the concurrency.
    for verdict in verdicts:
        assert f"{verdict['results_file']} (run {verdict['run_id']}" in table
        assert f"concurrency {verdict['concurrency']}" in table


def test_patched_script_installs_the_probe_after_the_pipeline_and_trips(tree, sim, tmp_path) -> None:
    """Both shapes of `_patch_lm_eval`: the probe lands after the pipeline's own patch (its
    static `parse_generations`), and trips on top of it."""
    run = eval_probe("patch", str(tree))
    assert run.returncode == 0, run.stderr
    assert subprocess.run(["bash", "-n", str(tree)]).returncode == 0
    site = patched_site(tree)
    text = site.read_text()
    compile(text, str(site), "exec")
    assert text.index("PIPELINE_PATCHED = True") < text.index(SITECUSTOMIZE.end_line)

    server = sim("never_stop")
    task = write_task(tmp_path / "task", 30)
    output = tmp_path / "out"
    command = [
        PYTHON, "-m", "lm_eval", "--model", "local-chat-completions", "--apply_chat_template",
        "--model_args", f"model=sim,base_url={server.base_url}/v1/chat/completions,num_concurrent=16,"
        "tokenized_requests=False,max_retries=2",
        "--tasks", str(task.yaml), "--output_path", str(output),
        "--gen_kwargs", "max_tokens=4096,temperature=0,top_p=1",
    ]  # fmt: skip
    env = offline_env(site.parent, EVAL_RESULT_DIR=str(output))
    lm_eval = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert lm_eval.returncode == 0, lm_eval.stderr[-3000:]
    assert "[lm-eval-probe] tripped" in lm_eval.stderr
    assert json.loads((output / contract.SIDECAR_NAME).read_text())["verdict"]["observations"] == 16
    assert server.snapshot()["generate_requests"] < 30


def test_a_concurrency_inferencex_records_as_failed_is_unavailable(tmp_path) -> None:
    (tmp_path / "meta_env.json").write_text(json.dumps({"eval_concs": [8, 16], "failed_eval_concs": [16]}))
    read = eval_probe("read", str(tmp_path), "--json")
    verdicts = json.loads(read.stdout)
    assert read.returncode == 2
    assert [(v["concurrency"], v["status"]) for v in verdicts] == [(8, "unavailable"), (16, "unavailable")]
    assert "no results file for concurrency 8" in verdicts[0]["reason"] and "failed" in verdicts[1]["reason"]
