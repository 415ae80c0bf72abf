"""Several runs in one directory, on real lm-eval output (issue 35): ``--newest`` means newest per
model and per task, and a trip record is attached only to the run it belongs to."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.procs import probe_site
from support.procs import read_json as read

from probe.demo.localtask import SECOND_TASK, LocalTask, offline_env, write_task
from probe.demo.simserver import SimServer
from probe.runtime.core import contract

pytestmark = pytest.mark.entry


def evaluate(task: LocalTask, mode: str, model: str, output: Path, site: Path | None) -> None:
    """lm-eval on ``task`` as ``model``, its results written straight into ``output``'s directory
    (a ``.json`` output path: as InferenceX's lm-eval writes every model)."""
    with SimServer(mode) as sim:
        command = task.lm_eval_command(sim.base_url, model, output / "results.json", 2048, 8)
        env = offline_env(site, RESULT_DIR=str(output))
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def test_newest_keeps_every_model_and_every_task_that_shares_the_directory(tmp_path) -> None:
    site, output = probe_site(tmp_path / "site"), tmp_path / "out"
    first, second = write_task(tmp_path / "a", 16), write_task(tmp_path / "b", 16, SECOND_TASK)
    evaluate(first, "never_stop", "model-a", output, site)  # model A trips
    evaluate(first, "healthy", "model-b", output, site)  # then healthy model B runs there
    evaluate(second, "healthy", "model-b", output, site)  # and B's second task, in a run of its own
    code, verdicts = read(output, "--newest", "--floor", "0.5")
    found = {(v["model"], v["task"]): v["status"] for v in verdicts}
    assert found == {("model-a", first.name): "below_floor", ("model-b", first.name): "ok",
                     ("model-b", second.name): "ok"} and code == 1  # fmt: skip
    # A re-run of one task supersedes that task only.
    evaluate(first, "never_stop", "model-b", output, site)
    _, verdicts = read(output, "--newest", "--floor", "0.5")
    found = {(v["model"], v["task"]): v["status"] for v in verdicts}
    assert found[("model-b", first.name)] == "below_floor" and found[("model-b", second.name)] == "ok"
    assert len(verdicts) == 3


def test_a_killed_runs_trip_never_lands_on_another_models_results(tmp_path) -> None:
    output, task = tmp_path / "out", write_task(tmp_path / "task", 16)
    evaluate(task, "healthy", "model-b", output, None)  # model B, unprobed
    earlier = set(output.rglob("results_*.json"))
    evaluate(task, "never_stop", "model-a", output, probe_site(tmp_path / "site"))  # model A trips
    (killed,) = set(output.rglob("results_*.json")) - earlier
    killed.unlink()  # as if A had been killed before it wrote its results
    assert (output / contract.SIDECAR_NAME).exists()
    code, verdicts = read(output, "--floor", "0.5")
    (b,) = [v for v in verdicts if v["results_file"] is not None]
    (a,) = [v for v in verdicts if v["results_file"] is None]  # A's trip, a row of its own
    assert b["status"] == "ok" and b["pathology"] is None
    assert a["status"] == "below_floor" and a["trip_record"] and code == 1


def test_a_group_whose_task_was_re_run_never_stands_for_it(tmp_path) -> None:
    site, output, root = probe_site(tmp_path / "site"), tmp_path / "out", tmp_path / "tasks"
    first, second = write_task(root, 16), write_task(root, 16, SECOND_TASK)
    (root / "probe_group.yaml").write_text(f"group: probe_plain_group\ntask:\n  - {first.name}\n  - {second.name}\n")
    for mode, tasks in (("healthy", "probe_plain_group"), ("never_stop", first.name)):
        with SimServer(mode) as sim:
            command = first.lm_eval_command(sim.base_url, "model-a", output / "results.json", 2048, 8)
            command[command.index(str(first.yaml))] = tasks
            run = subprocess.run([*command, "--include_path", str(root)], env=offline_env(site, RESULT_DIR=str(output)),
                                 capture_output=True, text=True, timeout=300)  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
    code, verdicts = read(output, "--newest", "--floor", "0.5")
    found = {v["task"]: v["status"] for v in verdicts}
    assert found == {"probe_plain_group": "unavailable", first.name: "below_floor", second.name: "ok"} and code == 2
