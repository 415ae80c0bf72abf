"""`eval-probe read DIR` judges every evaluation the directory holds: each model directory, each
run in it, each InferenceX concurrency, each trip whose run left no results file. Each row says
which results file and run it comes from; the exit code is the worst; --newest is the old view."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from support.procs import PYTHON
from support.resultfiles import STARTED, figures, write_results, write_run, write_sidecar

from probe import exitcodes
from probe.runtime.core import contract

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

RUN_A, RUN_B = "a" * 32 + ".1", "b" * 32 + ".2"
CUT = figures(cut_off=16, causes={"output_cap": 16}, finish_reasons={"length": 16}, observations=16,
              short_circuited=24, tripped=True)  # fmt: skip


def read(directory: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "probe", "read", str(directory), *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def verdicts(directory: Path, *args: str) -> tuple[int, list[dict]]:
    run = read(directory, "--json", *args)
    assert run.returncode in exitcodes.READ_STATUS.values(), run.stderr[-2000:]
    return run.returncode, json.loads(run.stdout)


def sweep(directory: Path) -> tuple[Path, Path]:
    """lm-eval's layout for a sweep over two models: model A tripped, model B (later) is healthy."""
    a = write_run(directory, {"gsm8k": 0.0}, {"gsm8k": CUT}, tripped=True, run_id=RUN_A, subdir="model-a",
                  model_name="model-a")  # fmt: skip
    write_sidecar(directory, tripped_at=STARTED + 30, record={"run_id": RUN_A, "tasks": ["gsm8k"], "model": "model-a"})
    b = write_run(directory, {"gsm8k": 0.9}, {"gsm8k": figures()}, run_id=RUN_B, subdir="model-b",
                  date=STARTED + 600, model_name="model-b")  # fmt: skip
    return a, b


def test_a_sweep_is_judged_model_by_model(tmp_path: Path) -> None:
    a, b = sweep(tmp_path)
    code, found = verdicts(tmp_path)
    assert code == exitcodes.READ_STATUS["below_floor"]
    rows = {(v["results_file"], v["run_id"]): v["status"] for v in found}
    assert rows == {(str(a), RUN_A): "below_floor", (str(b), RUN_B): "ok"}
    # The table names the file and the run of each block.
    text = read(tmp_path).stdout
    assert f"{a} (run {RUN_A}" in text and f"{b} (run {RUN_B}" in text


def test_a_run_that_tripped_and_left_no_results_is_never_hidden_by_a_healthy_one(tmp_path: Path) -> None:
    # Run A tripped and was killed before lm-eval wrote results; run B, healthy, ran later.
    write_sidecar(tmp_path, tripped_at=STARTED + 30, record={"run_id": RUN_A, "tasks": ["gsm8k"]})
    write_run(tmp_path, {"gsm8k": 0.9}, {"gsm8k": figures()}, run_id=RUN_B, date=STARTED + 600)
    for args in ((), ("--newest",)):  # the trip record names no model: no later run can supersede it
        code, found = verdicts(tmp_path, *args)
        assert code == exitcodes.READ_STATUS["below_floor"], args
        (orphan,) = [v for v in found if v["results_file"] is None]
        assert orphan["run_id"] == RUN_A and orphan["trip_record"] == str(tmp_path / contract.SIDECAR_NAME)
        assert "no results file of this run" in orphan["reason"] and orphan["pathology"]["observations"] == 16


def test_newest_keeps_the_newest_run_of_each_model_directory(tmp_path: Path) -> None:
    # A re-run into the same output path: the first tripped, the second (later) is healthy.
    first = write_run(tmp_path, {"gsm8k": 0.0}, {"gsm8k": CUT}, tripped=True, run_id=RUN_A, model_name="m")
    write_sidecar(tmp_path, tripped_at=STARTED + 30, record={"run_id": RUN_A, "tasks": ["gsm8k"], "model": "m"})
    second = write_run(tmp_path, {"gsm8k": 0.9}, {"gsm8k": figures()}, run_id=RUN_B, date=STARTED + 600,
                       name="results_2026-11-30T02-00-00.000000.json", model_name="m")  # fmt: skip
    code, found = verdicts(tmp_path)
    assert code == exitcodes.READ_STATUS["below_floor"]
    assert [(v["results_file"], v["status"]) for v in found] == [(str(first), "below_floor"), (str(second), "ok")]
    code, found = verdicts(tmp_path, "--newest")
    assert code == 0 and [v["results_file"] for v in found] == [str(second)]


def test_records_moved_aside_judge_their_own_runs(tmp_path: Path) -> None:
    # Model A tripped, then model B tripped too: the runtime moved A's record aside for B's.
    a = write_run(tmp_path, {"gsm8k": 0.0}, {"gsm8k": CUT}, tripped=True, run_id=RUN_A, subdir="model-a")
    moved = write_sidecar(tmp_path, tripped_at=STARTED + 30, name=f"{contract.SIDECAR_NAME}.stale-{int(STARTED)}",
                          record={"run_id": RUN_A, "tasks": ["gsm8k"]})  # fmt: skip
    write_sidecar(tmp_path, tripped_at=STARTED + 630, record={"run_id": RUN_B, "tasks": ["gsm8k"]})
    code, found = verdicts(tmp_path)
    by_file = {v["results_file"]: v for v in found}
    assert code == exitcodes.READ_STATUS["below_floor"]
    assert by_file[str(a)]["trip_record"] == str(moved) and by_file[str(a)]["pathology"]["short_circuited_requests"]
    # B's results were never written: its own row, from the sidecar.
    assert by_file[None]["run_id"] == RUN_B and by_file[None]["status"] == "below_floor"


def test_an_unreadable_record_moved_aside_is_unavailable(tmp_path: Path) -> None:
    write_results(tmp_path, 0.9)
    (tmp_path / f"{contract.SIDECAR_NAME}.stale-17").write_text("{not json")
    code, found = verdicts(tmp_path)
    assert code == exitcodes.READ_STATUS["unavailable"]
    assert any("stale-17" in v["reason"] and v["status"] == "unavailable" for v in found)


def test_a_failed_concurrency_stays_whatever_task_is_selected(tmp_path: Path) -> None:
    write_results(tmp_path, 0.9, name="results_2026-11-30T01-00-00.000000_conc8.json", subdir=None)
    (tmp_path / "meta_env.json").write_text(json.dumps({"eval_concs": [8, 64], "failed_eval_concs": [64]}))
    for args in (("--task", "gsm8k"), ("--task", "gsm8k", "--metric", "exact_match,strict-match"), ("--newest",)):
        run = read(tmp_path, *args)
        assert run.returncode == exitcodes.READ_STATUS["unavailable"], (args, run.stdout)
        assert "concurrency 64 as failed" in run.stdout


def test_a_task_in_no_run_lists_the_tasks_there_are(tmp_path: Path) -> None:
    write_run(tmp_path, {"gsm8k": 0.9, "mmlu": 0.5}, {})
    run = read(tmp_path, "--task", "nosuch")
    assert run.returncode == exitcodes.READ_STATUS["unavailable"]
    assert "'gsm8k', 'mmlu'" in run.stdout and "None" not in run.stdout, run.stdout


def test_a_missing_directory_is_unavailable_not_a_usage_error(tmp_path: Path) -> None:
    run = read(tmp_path / "not-there")
    assert run.returncode == exitcodes.READ_STATUS["unavailable"] and "does not exist" in run.stdout


def test_the_floor_help_says_what_the_floor_accepts(tmp_path: Path) -> None:
    write_results(tmp_path, 0.9)
    shown = subprocess.run([PYTHON, "-m", "probe", "read", "--help"], capture_output=True, text=True, check=True)
    assert "an exponent allowed" in " ".join(shown.stdout.split())
    assert read(tmp_path, "--floor", "1e-3").returncode == 0
    refused = read(tmp_path, "--floor", "nan")
    assert refused.returncode == exitcodes.USAGE and "an exponent allowed" in refused.stderr


def test_the_json_keeps_its_shape_and_names_the_run(tmp_path: Path) -> None:
    sweep(tmp_path)
    _, found = verdicts(tmp_path)
    shape = {"status", "reason", "task", "metric", "score", "cap_rate", "cause", "caveat", "evidence", "pathology",
             "floor", "higher_is_better", "concurrency", "results_file", "sidecar"}  # fmt: skip
    for verdict in found:
        assert shape <= set(verdict) and {"run_id", "started_at", "trip_record", "model"} <= set(verdict)
        assert set(verdict["sidecar"]) == {"state", "path", "error"}


def test_an_unreadable_meta_env_hides_no_run(tmp_path: Path) -> None:
    a, _ = sweep(tmp_path)
    (tmp_path / "meta_env.json").write_text("{not json")
    code, found = verdicts(tmp_path)
    assert code == exitcodes.READ_STATUS["unavailable"]
    assert any("meta_env.json cannot be read" in v["reason"] for v in found)
    assert {v["results_file"]: v["status"] for v in found if v["results_file"]}[str(a)] == "below_floor"


@pytest.mark.parametrize(
    "meta",
    [{"eval_concs": "8 16 " + "1" * 4301}, {"failed_eval_concs": ["9" * 4301]}, {"eval_concs": [10**400]},
     {"eval_concs": ["0"]}, {"eval_concs": [True]}, {"eval_concs": ["١٦"]}],
    ids=["shell-4301-digits", "list-4301-digits", "int-401-digits", "zero", "bool", "other-digits"],
)  # fmt: skip
def test_a_meta_env_concurrency_that_is_no_plain_count_hides_no_run(tmp_path: Path, meta: dict) -> None:
    # Hostile round 26: int() refused a 4,301-digit string, and the reader died (exit 70).
    a, _ = sweep(tmp_path)
    (tmp_path / "meta_env.json").write_text(json.dumps(meta))
    code, found = verdicts(tmp_path)
    assert code == exitcodes.READ_STATUS["unavailable"]
    assert any("not a positive integer of at most 18 digits" in v["reason"] for v in found)
    assert {v["results_file"]: v["status"] for v in found if v["results_file"]}[str(a)] == "below_floor"


def test_a_name_the_terminal_cannot_show_is_escaped_never_a_crash(tmp_path: Path) -> None:
    path = write_results(tmp_path, 0.9, model_name="m\u00e9")
    document = json.loads(path.read_text())
    document["results"] = {"t\u00e2che": document["results"]["gsm8k"]}
    path.write_text(json.dumps(document))
    run = subprocess.run([PYTHON, "-m", "probe", "read", str(tmp_path)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONIOENCODING": "ascii"})  # fmt: skip
    assert run.returncode == 0 and "t\\xe2che" in run.stdout, run.stderr
    (verdict,) = json.loads(read(tmp_path, "--json").stdout)
    assert (verdict["task"], verdict["model"]) == ("t\u00e2che", "m\u00e9")


def test_newest_never_hides_a_trip_behind_a_file_it_cannot_read(tmp_path: Path) -> None:
    write_run(tmp_path, {"gsm8k": 0.0}, {"gsm8k": CUT}, tripped=True, run_id=RUN_A, date=STARTED + 100)
    write_sidecar(tmp_path, tripped_at=STARTED + 130, record={"run_id": RUN_A, "tasks": ["gsm8k"]})
    (tmp_path / "model" / "results_2020-01-01T00-00-00.000000.json").write_text('{"results": ')
    code, found = verdicts(tmp_path, "--newest")
    assert sorted(v["status"] for v in found) == ["below_floor", "unavailable"] and code == 2
    assert any(v["trip_record"] for v in found)


def test_generations_replayed_from_the_cache_are_counted_with_the_tasks_repeats(tmp_path: Path) -> None:
    # 20 documents, 2 generations each: the probe saw 28 of the 40, the rest replayed.
    seen = figures(observations=28)
    write_run(tmp_path, {"gsm8k": 0.9}, {"gsm8k": seen}, **{"n-samples": {"gsm8k": {"original": 20, "effective": 20}},
              "configs": {"gsm8k": {"output_type": "generate_until", "repeats": 2}}})  # fmt: skip
    code, (verdict,) = verdicts(tmp_path, "--cap-rate-fails")
    assert verdict["status"] == "unavailable" and "28 of the 40 generations" in verdict["reason"] and code == 2
