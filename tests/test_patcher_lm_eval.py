"""`eval-probe patch` end to end: the patched benchmark_lib.sh, sourced by bash, installs the probe on
top of the pipeline's own patches, and real lm-eval trips under it. Run against every lm-eval release
scripts/test.sh tests (unlike test_patcher.py, whose tests never start lm-eval)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support.procs import PYTHON

from patcher.markers import SITECUSTOMIZE
from probe.demo.localtask import offline_env, write_task
from probe.runtime import contract


def patched_site(script: Path) -> Path:
    """Source the script in bash and call _patch_lm_eval; returns the sitecustomize.py made."""
    shell = f'source "{script}" && _patch_lm_eval && printf %s "$PYTHONPATH"'
    run = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert run.returncode == 0, run.stderr
    return Path(run.stdout.split(":")[0]) / "sitecustomize.py"


def test_patched_script_installs_the_probe_after_the_pipeline_and_trips(tree, sim, tmp_path) -> None:
    run = subprocess.run([PYTHON, "-m", "probe", "patch", str(tree)], capture_output=True, text=True, timeout=120)
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
