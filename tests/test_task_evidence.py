"""Evidence for every run and every task, carried inside lm-eval's own results file.

Real lm-eval (the CLI, or its model classes in-process) against the simulated server; the
probe installed through the injected text only, as InferenceX installs it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from lm_eval.api.instance import Instance
from support.lm import GEN_KWARGS, chat, completions, prompts
from support.procs import PYTHON, probe_site
from support.resultfiles import written_by_lm_eval

from probe.demo.localtask import COUNT_MARKER, METRIC, SECOND_TASK, TASK, offline_env, write_task
from probe.demo.simserver import SimServer
from probe.runtime.core import contract
from probe.runtime.core.contract import EVIDENCE_KEY


def read_cli(output: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "probe", "read", str(output), *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def results_of(output: Path) -> dict:
    (path,) = written_by_lm_eval(output, "results_*.json")
    return json.loads(path.read_text())


def samples_of(output: Path, task: str) -> list[str]:
    (path,) = written_by_lm_eval(output, f"samples_{task}_20*.jsonl")  # the time follows: gsm8k is not gsm8k_cot
    rows = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["doc_id"])
    return [row["resps"][0][0] for row in rows]


@pytest.fixture(scope="module")
def two_tasks(tmp_path_factory) -> dict:
    """One lm-eval run of two tasks against one server: it never stops on the second task's
    prompts and answers the first task's correctly. Probed through the injected text only."""
    root = tmp_path_factory.mktemp("two")
    healthy, broken = write_task(root / "tasks", 24, TASK), write_task(root / "tasks", 24, SECOND_TASK)
    output = root / "out"
    with SimServer("healthy", loop_marker=COUNT_MARKER) as server:
        command = healthy.lm_eval_command(
            server.base_url, "sim", output, 2048, 8, "--log_samples", model_args="max_retries=2", also=(broken,)
        )
        env = offline_env(probe_site(root / "site"), RESULT_DIR=str(output))
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return {"output": output, "healthy": healthy.name, "broken": broken.name}


@pytest.mark.entry
def test_two_tasks_in_one_run_each_get_their_own_evidence(two_tasks) -> None:
    output, healthy, broken = two_tasks["output"], two_tasks["healthy"], two_tasks["broken"]
    document = results_of(output)
    evidence = document[EVIDENCE_KEY]
    sick, well = evidence["tasks"][broken], evidence["tasks"][healthy]
    assert (sick["tripped"], well["tripped"]) == (True, False)
    assert well["observations"] == well["generate_requests"] == 24 and well["cut_off"] == 0
    assert sick["cut_off"] == sick["observations"] >= 16 and sick["causes"]["output_cap"] == sick["cut_off"]
    assert sick["short_circuited"] == 24 - sick["observations"]
    # The healthy task's answers are real, its score untouched; the broken one was blanked.
    assert samples_of(output, healthy) == [f" {10 * i + 3}" for i in range(24)]
    assert document["results"][healthy][METRIC] == 1.0
    trip = json.loads((output / contract.SIDECAR_NAME).read_text())
    assert trip["verdict"]["tasks"] == [broken]
    assert [g["tasks"] for g in trip["final"]["short_circuited_groups"]] == [[broken]]
    # Nothing that lm-eval's or InferenceX's readers would take for a score or a version.
    text = json.dumps(evidence)
    assert "lm_eval_version" not in text and not any("," in key for key in _keys(evidence))


@pytest.mark.entry
def test_read_gives_each_of_two_tasks_its_own_status(two_tasks) -> None:
    output, healthy, broken = two_tasks["output"], two_tasks["healthy"], two_tasks["broken"]
    table = read_cli(output)
    assert table.returncode == 1  # the worst status: below_floor
    lines = table.stdout.splitlines()
    (path,) = written_by_lm_eval(output, "results_*.json")
    assert lines[0].startswith(f"{path} (run ")  # the block names its results file and run
    rows = {line.split()[0]: line.split() for line in lines[2:4]}
    assert rows[healthy][2:4] == ["1", "ok"] and rows[broken][2:4] == ["0", "below_floor"]
    assert "output cap: cut short" in table.stdout  # the trip names its cause
    assert read_cli(output, "--task", healthy).returncode == 0
    one = read_cli(output, "--task", broken, "--json")
    assert one.returncode == 1 and json.loads(one.stdout)["pathology"]["tasks"] == [broken]
    listed = json.loads(read_cli(output, "--json").stdout)
    assert [(v["task"], v["status"]) for v in listed] == [(healthy, "ok"), (broken, "below_floor")]


def _keys(value: object) -> list[str]:
    if isinstance(value, dict):
        return [k for k in value] + [k for v in value.values() for k in _keys(v)]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []


@pytest.fixture(scope="module")
def capped(tmp_path_factory) -> dict:
    """A run where about 30% of the generations hit the cap: the rule rightly does not fire."""
    root = tmp_path_factory.mktemp("capped")
    task = write_task(root / "t", 60)
    output = root / "out"
    with SimServer("mixed", cap_fraction=0.3) as server:
        command = task.lm_eval_command(server.base_url, "sim", output, 2048, 8, model_args="max_retries=2")
        run = subprocess.run(command, env=offline_env(probe_site(root / "site"), RESULT_DIR=str(output)),
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        at_cap = sum(1 for p in _task_prompts(60) if server.at_cap(p))
    assert run.returncode == 0, run.stderr[-3000:]
    return {"output": output, "at_cap": at_cap, "task": task.name}


def test_a_run_with_30_percent_at_the_cap_carries_its_evidence(capped) -> None:
    evidence = results_of(capped["output"])[EVIDENCE_KEY]
    assert evidence["tripped"] is False and not (capped["output"] / contract.SIDECAR_NAME).exists()
    found, at_cap = evidence["tasks"][capped["task"]], capped["at_cap"]
    assert found["cut_off"] == found["causes"]["output_cap"] == at_cap and 10 <= at_cap <= 30
    assert found["cut_off_rate"] == round(at_cap / 60, 6)


def test_read_reports_the_cap_rate_and_the_caveat_with_its_bound(capped) -> None:
    output, at_cap = capped["output"], capped["at_cap"]
    score = results_of(output)["results"][capped["task"]][METRIC]
    (verdict,) = json.loads(read_cli(output, "--json").stdout)
    assert verdict["status"] == "ok" and verdict["cap_rate"] == pytest.approx(at_cap / 60)
    caveat = verdict["caveat"]
    assert (caveat["cut_off"], caveat["observations"]) == (at_cap, 60)
    assert caveat["bound"] == pytest.approx(min(1.0, score + at_cap / 60))
    assert f"{at_cap} of 60 generations were cut off ({at_cap} output cap)" in caveat["text"]
    table = read_cli(output)
    assert table.returncode == 0 and f"{at_cap / 60:.1%}" in table.stdout and "lower bound" in table.stdout
    # Orchestrators that want a hard stop: the exceeded threshold is below_floor.
    assert read_cli(output, "--cap-rate-fails").returncode == 1
    assert read_cli(output, "--max-cap-rate", "0.5").stdout.count("lower bound") == 0


def _task_prompts(n: int) -> list[str]:
    return [f"Question: What is {3 * i + 1} + {7 * i + 2}?\nAnswer:" for i in range(n)]


def _instances(n: int, task: str, gen_kwargs: dict, chat_format: bool) -> list[Instance]:
    from lm_eval.models.api_models import JsonChatStr

    requests = []
    for i, text in enumerate(prompts(n)):
        context = JsonChatStr(json.dumps([{"role": "user", "content": text}])) if chat_format else text
        requests.append(
            Instance("generate_until", doc={}, arguments=(context, gen_kwargs), idx=i, metadata=(task, i, 1))
        )
    return requests


@pytest.mark.entry
@pytest.mark.parametrize("chat_format", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize(
    ("mode", "cause"),
    [("never_stop", "output_cap"), ("window", "context_window"), ("repetition", "repetition"),
     ("reasoning", "reasoning"), ("empty", None)],
)  # fmt: skip
def test_each_cause_is_kept_apart(sim, probed, mode, cause, chat_format) -> None:
    server = sim(mode)
    lm = chat(server.base_url) if chat_format else completions(server.base_url)
    lm.generate_until(_instances(12, "t", {**GEN_KWARGS, "max_tokens": 512}, chat_format))  # below the rule's budget
    found = probed.evidence_document()["tasks"]["t"]
    assert found["observations"] == found["generate_requests"] == found["below_min_max_tokens"] == 12
    expected = cause if (cause != "reasoning" or chat_format) else "output_cap"  # completions carry no reasoning
    if expected is None:
        assert found["cut_off"] == 0 and found["empty_answers"] == 12 and found["finish_reasons"] == {"stop": 12}
    else:
        assert found["causes"][expected] == found["cut_off"] == 12
    assert found["short_circuited"] == 0 and probed.evidence_document()["tripped"] is False


@pytest.mark.entry
def test_loglikelihood_requests_are_counted_apart(sim, probed) -> None:
    import asyncio

    server = sim("never_stop")
    lm = completions(server.base_url, num_concurrent=4)
    lm.tokenized_requests = True
    asyncio.run(lm.get_batched_requests([[1, 2, 3], [4, 5]], cache_keys=[("a", "b"), ("c", "d")], generate=False,
                                        ctxlens=[1, 1]))  # fmt: skip
    document = probed.evidence_document()
    assert document["loglikelihood_requests"] == 2 and document["tasks"] == {}


def test_two_evaluations_under_one_command_are_two_runs(sim, tmp_path) -> None:
    """A script that runs lm-eval twice into one directory (the second run healthy): the
    first run's trip never stands for the second, whose results are judged on their own."""
    task = write_task(tmp_path / "t", 24)
    never, healthy = sim("never_stop"), sim("healthy")
    output = tmp_path / "out"
    first = task.lm_eval_command(never.base_url, "sim", output, 2048, 8, model_args="max_retries=2")
    second = task.lm_eval_command(healthy.base_url, "sim", output, 2048, 8, model_args="max_retries=2")
    script = f"{shlex.join(first)} && sleep 1 && {shlex.join(second)}"
    run = subprocess.run([PYTHON, "-m", "probe", "run", "--result-dir", str(output), "--", "bash", "-c", script],
                         env=offline_env(None), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    trip = json.loads((output / contract.SIDECAR_NAME).read_text())["verdict"]
    newest = max(written_by_lm_eval(output, "results_*.json"), key=lambda p: json.loads(p.read_text())["date"])
    assert json.loads(newest.read_text())[EVIDENCE_KEY]["run_id"] != trip["run_id"]
    # Every run in the directory is judged: the first by its own trip, the second on its own.
    first_run, second_run = json.loads(read_cli(output, "--json").stdout)
    assert (first_run["status"], first_run["run_id"]) == ("below_floor", trip["run_id"])
    assert (second_run["status"], second_run["score"], second_run["sidecar"]["state"]) == ("ok", 1.0, "another run's")
    # The newest-only view: the second run alone.
    (verdict,) = json.loads(read_cli(output, "--json", "--newest").stdout)
    assert (verdict["results_file"], verdict["status"]) == (str(newest), "ok")
