"""The reader judges what lm-eval measured (issue 35), on real lm-eval output: a metric lm-eval
computed, never a count (``sample_len``) or a placeholder (``bypass``); a group without a score of
its own follows its tasks; a probed task whose answers were replayed from lm-eval's cache has an
unknown cap rate, which ``--cap-rate-fails`` never lets through."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.procs import probe_site
from support.procs import read_json as read

from probe.demo.localtask import LocalTask, offline_env, write_task
from probe.demo.simserver import SimServer

DOCS = 20
pytestmark = pytest.mark.entry


def custom_task(root: Path, metrics: dict[str, bool]) -> LocalTask:
    """The local task scored by a ``process_results`` of its own that gives each of ``metrics``
    (name: higher is better) 1.0 for a right answer, as IFEval's or mbpp's do."""
    task = write_task(root, DOCS)
    names = ", ".join(f"{name!r}: right" for name in metrics)
    (root / "probe_scoring.py").write_text(
        f"def process_results(doc, results):\n    right = float(results[0].strip() == doc['answer'])\n"
        f"    return {{{names}}}\n"
    )
    listed = "".join(
        f"  - metric: {name}\n    aggregation: mean\n    higher_is_better: {str(higher).lower()}\n"
        for name, higher in metrics.items()
    )
    yaml = task.yaml.read_text()
    head, _, rest = yaml.partition("metric_list:\n")
    _, _, tail = rest.partition("filter_list:")
    task.yaml.write_text(f"{head}process_results: !function probe_scoring.process_results\nmetric_list:\n{listed}"
                         f"filter_list:{tail}")  # fmt: skip
    return task


def evaluate(task: LocalTask, mode: str, output: Path, *extra: str, probed: bool = True, **server: object) -> None:
    with SimServer(mode, **server) as sim:  # type: ignore[arg-type]
        command = task.lm_eval_command(sim.base_url, "sim", output, 256, 8, *extra)
        site = probe_site(output.parent / f"site-{output.name}") if probed else None
        run = subprocess.run(command, env=offline_env(site), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


def test_a_task_scored_by_a_metric_of_its_own_is_judged_on_it_never_on_sample_len(tmp_path) -> None:
    task = custom_task(tmp_path / "task", {"pass_at_1": True})
    evaluate(task, "empty", tmp_path / "out")  # a model that answers nothing: pass_at_1 0.0
    code, (verdict,) = read(tmp_path / "out", "--floor", "0.5")
    assert (verdict["metric"], verdict["score"], verdict["status"], code) == ("pass_at_1,strict-match", 0.0,
                                                                              "below_floor", 1)  # fmt: skip


def test_several_metrics_none_accuracy_like_are_never_ok_and_the_reader_says_to_choose(tmp_path) -> None:
    task = custom_task(tmp_path / "task", {"prompt_level_strict_acc": True, "inst_level_strict_acc": True})
    evaluate(task, "healthy", tmp_path / "out")
    code, (verdict,) = read(tmp_path / "out")
    assert verdict["status"] == "unavailable" and code == 2 and "choose one with --metric" in verdict["reason"]
    code, (verdict,) = read(tmp_path / "out", "--metric", "inst_level_strict_acc,strict-match")
    assert (verdict["status"], verdict["score"], code) == ("ok", 1.0, 0)


def test_a_lower_is_better_metric_is_never_judged_against_an_accuracy_floor(tmp_path) -> None:
    task = custom_task(tmp_path / "task", {"error_rate": False})
    evaluate(task, "healthy", tmp_path / "out")  # every answer right: error_rate 1.0 by this scoring
    code, (verdict,) = read(tmp_path / "out")
    assert verdict["status"] == "unavailable" and "--lower-is-better" in verdict["reason"] and code == 2
    # Chosen with --metric, it is still read only the way lm-eval records it.
    code, (verdict,) = read(tmp_path / "out", "--metric", "error_rate,strict-match", "--floor", "0.5")
    assert verdict["status"] == "unavailable" and "read it with --lower-is-better" in verdict["reason"]
    code, (verdict,) = read(tmp_path / "out", "--metric", "error_rate,strict-match", "--floor", "0.5",
                            "--lower-is-better")  # fmt: skip
    assert (verdict["status"], code) == ("below_floor", 1)
    # A count (0.4.13's rows hold sample_len; older rows do not) or a standard error is no score.
    for counted in ("sample_len", "error_rate_stderr,strict-match"):
        code, (verdict,) = read(tmp_path / "out", "--metric", counted, "--lower-is-better")
        assert verdict["status"] == "unavailable" and code == 2


def test_a_predict_only_run_measured_nothing_and_is_never_ok(tmp_path) -> None:
    task = write_task(tmp_path / "task", DOCS)
    evaluate(task, "healthy", tmp_path / "out", "--predict_only", "--log_samples")
    code, (verdict,) = read(tmp_path / "out")
    assert verdict["status"] == "unavailable" and "measured no metric" in verdict["reason"] and code == 2


def test_a_group_without_a_score_of_its_own_follows_its_tasks(tmp_path) -> None:
    task = write_task(tmp_path / "task", DOCS)
    (tmp_path / "task" / "probe_group.yaml").write_text(f"group: probe_plain_group\ntask:\n  - {task.name}\n")
    with SimServer("healthy") as sim:
        command = task.lm_eval_command(sim.base_url, "sim", tmp_path / "out", 256, 8)
        command[command.index(str(task.yaml))] = "probe_plain_group"
        command += ["--include_path", str(tmp_path / "task")]
        run = subprocess.run(command, env=offline_env(probe_site(tmp_path / "site")), capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    code, verdicts = read(tmp_path / "out", "--floor", "0.5")
    assert {v["task"]: v["status"] for v in verdicts} == {"probe_plain_group": "ok", task.name: "ok"} and code == 0
    evaluate(task, "empty", tmp_path / "empty")
    code, verdicts = read(tmp_path / "empty", "--floor", "0.5")
    assert all(v["status"] == "below_floor" for v in verdicts) and code == 1


def test_answers_replayed_from_lm_evals_cache_never_pass_the_cap_rate_stop(tmp_path) -> None:
    task, cache = write_task(tmp_path / "task", 40), str(tmp_path / "cache" / "run")
    # About a quarter of the answers run to the cap: under the rule, over --max-cap-rate 0.05.
    for run in ("first", "second"):
        evaluate(task, "mixed", tmp_path / run, "--use_cache", cache, cap_fraction=0.25)
    code, (first,) = read(tmp_path / "first", "--cap-rate-fails", "--max-cap-rate", "0.05")
    assert first["status"] == "below_floor" and code == 1
    code, (second,) = read(tmp_path / "second", "--cap-rate-fails", "--max-cap-rate", "0.05")
    assert second["status"] != "ok" and second["cap_rate"] is None and code != 0
    assert "cap rate is unknown" in second["reason"]


def test_answers_partly_replayed_from_the_cache_never_pass_the_cap_rate_stop(tmp_path) -> None:
    task, cache = write_task(tmp_path / "task", 40), str(tmp_path / "cache" / "run")
    evaluate(task, "mixed", tmp_path / "first", "--use_cache", cache, "--limit", "20", cap_fraction=0.5)
    evaluate(task, "healthy", tmp_path / "second", "--use_cache", cache)  # 20 replayed, 20 generated
    code, (verdict,) = read(tmp_path / "second", "--cap-rate-fails", "--max-cap-rate", "0.05")
    assert verdict["status"] == "unavailable" and "of the 40 generations lm-eval scored" in verdict["reason"]
    assert code == 2 and verdict["cap_rate"] is None
    # Without the stop, the score stands, but the rate over the half it saw is never shown as the task's.
    code, (verdict,) = read(tmp_path / "second", "--max-cap-rate", "0.05")
    assert verdict["cap_rate"] is None and "20 of the 40 generations lm-eval scored" in verdict["reason"]
    assert "its cap rate is unknown" in verdict["reason"]


def test_an_unprobed_generate_task_never_passes_the_cap_rate_stop(tmp_path) -> None:
    # A pipeline whose patch did not apply: nothing watched how its answers ended.
    task = write_task(tmp_path / "task", DOCS)
    evaluate(task, "healthy", tmp_path / "out", probed=False)
    code, (verdict,) = read(tmp_path / "out", "--cap-rate-fails")
    assert verdict["status"] == "unavailable" and "the probe did not watch this run" in verdict["reason"]
    assert code == 2
    code, (verdict,) = read(tmp_path / "out")
    assert verdict["status"] == "ok" and code == 0
