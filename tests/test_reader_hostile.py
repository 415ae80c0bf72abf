"""What a hostile reviewer of the reader found: files and layouts that made `eval-probe read`
say ok (exit 0) where a pipeline must stop, or read in quadratic time. Each test failed
before its fix."""

from __future__ import annotations

import gc
import json
import subprocess
import time
from pathlib import Path

import pytest
from support.procs import PYTHON
from support.resultfiles import METRIC, NAME, STARTED, evidence, figures, write_results, write_run, write_sidecar

from probe import exitcodes
from probe.reader.candidates import Candidate
from probe.reader.evaluations import holdings
from probe.reader.model import SidecarState
from probe.reader.sidecar import Sidecar, read_sidecar
from probe.runtime.core import contract
from probe.runtime.core.sidecar import read_sidecar_at

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

RUN = "f" * 32 + ".1"
TRIP = {
    "tripped": True,
    "pathology": "non_terminating",
    "observations": 16,
    "pathological": 16,
    "finish_reasons": {"length": 16},
    "max_tokens": [16384],
    "settings": {},
    "tripped_at": 1.0,
}
BELOW, UNAVAILABLE = exitcodes.READ_STATUS["below_floor"], exitcodes.READ_STATUS["unavailable"]


def read(directory: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "probe", "read", str(directory), "--floor", "0.5", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def grouped(directory: Path, scores: dict[str, float], tasks: dict, groups: dict, **extra: object) -> Path:
    path = write_run(directory, scores, tasks, run_id=RUN, **extra)
    document = json.loads(path.read_text())
    document["group_subtasks"] = groups
    path.write_text(json.dumps(document))
    return path


def test_a_group_follows_a_task_the_trip_names_that_has_no_row(tmp_path: Path) -> None:
    grouped(tmp_path, {"grp": 0.9, "other": 0.9}, {"other": figures()}, {"grp": ["sub", "other"]})
    write_sidecar(tmp_path, tripped_at=STARTED + 10, record={"run_id": RUN, "tasks": ["sub"]})
    run = read(tmp_path, "--task", "grp", "--json")
    assert run.returncode == UNAVAILABLE, run.stdout
    assert "'sub'" in json.loads(run.stdout)["reason"]


def test_a_group_follows_a_task_whose_row_is_not_an_object(tmp_path: Path) -> None:
    path = grouped(tmp_path, {"grp": 0.9, "other": 0.9}, {"other": figures()}, {"grp": ["sub", "other"]})
    document = json.loads(path.read_text())
    document["results"]["sub"] = "garbage"
    path.write_text(json.dumps(document))
    run = read(tmp_path, "--task", "grp")
    assert run.returncode == UNAVAILABLE, run.stdout


def test_a_run_marked_tripped_with_no_task_or_unattributed_trip_contradicts_itself(tmp_path: Path) -> None:
    write_run(tmp_path, {"gsm8k": 0.9}, {"gsm8k": figures()}, tripped=True, run_id=RUN)
    run = read(tmp_path)
    assert run.returncode == UNAVAILABLE, run.stdout
    assert "contradicts" in run.stdout


@pytest.mark.parametrize("tasks", [[], [1, None]], ids=["no-task", "no-task-name"])
def test_a_trip_of_this_run_that_names_no_task_never_leaves_a_task_ok(tmp_path: Path, tasks: list) -> None:
    # The run's own trip record (same run id) names no task it cut short; the results file's
    # evidence (written by a process that did not see the trip) cannot clear any task.
    write_run(tmp_path, {"gsm8k": 0.9, "arc": 0.9}, {"gsm8k": figures(), "arc": figures()}, run_id=RUN)
    write_sidecar(tmp_path, tripped_at=STARTED + 10, record={"run_id": RUN, "tasks": tasks})
    run = read(tmp_path, "--json")
    assert run.returncode == UNAVAILABLE, run.stdout
    assert {v["status"] for v in json.loads(run.stdout)} == {"unavailable"}


def test_duplicate_keys_in_a_results_file_are_unreadable_never_the_last_one_wins(tmp_path: Path) -> None:
    cut = json.dumps(evidence({"gsm8k": figures(tripped=True, short_circuited=30)}, tripped=True, run_id=RUN))
    healthy = json.dumps(evidence({"gsm8k": figures()}, run_id=RUN))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / NAME).write_text(
        f'{{"results": {{"gsm8k": {{"{METRIC}": 0.9}}}}, "date": {STARTED}, '
        f'"{contract.EVIDENCE_KEY}": {cut}, "{contract.EVIDENCE_KEY}": {healthy}}}'
    )
    run = read(tmp_path)
    assert run.returncode == UNAVAILABLE, run.stdout
    assert "duplicate key" in run.stdout


def test_duplicate_keys_make_a_sidecar_invalid_for_the_runtime_and_the_reader_alike(tmp_path: Path) -> None:
    path = write_sidecar(tmp_path)
    text = path.read_text()
    path.write_text(text.replace('"tripped": true', '"tripped": true, "tripped": false'))
    assert read_sidecar(tmp_path).state.value == "unreadable"
    document, problem = read_sidecar_at(str(path))
    assert document is None and "duplicate key" in problem


def test_a_deep_sidecar_is_invalid_for_the_runtime_and_the_reader_alike(tmp_path: Path) -> None:
    path = write_sidecar(tmp_path, record={"settings": {"x": json.loads("[" * 100 + "]" * 100)}})
    assert read_sidecar(tmp_path).state.value == "unreadable"
    document, problem = read_sidecar_at(str(path))
    assert document is None and "deep" in problem


def test_newest_never_drops_a_crashed_concurrency_for_a_later_one(tmp_path: Path) -> None:
    # InferenceX: concurrency 4 tripped and crashed (no results); concurrency 8, later, is healthy.
    write_run(tmp_path, {"gsm8k": 0.9}, {"gsm8k": figures()}, run_id="b" * 32 + ".2", subdir=None,
              name="results_2026-11-30T01-00-00.000000_conc8.json", date=STARTED + 600, model_name="m")  # fmt: skip
    write_sidecar(tmp_path, tripped_at=STARTED + 30, record={"run_id": RUN, "tasks": ["gsm8k"], "model": "m"})
    run = read(tmp_path, "--newest")
    assert run.returncode == BELOW, run.stdout


def test_pairing_trip_records_with_runs_is_linear() -> None:
    # n results without a run id and n trip records that predate them all: each record is
    # offered to every run before it is found to be an orphan, unless pairing is linear.
    record = json.loads(json.dumps(TRIP))

    def seconds(n: int) -> float:
        candidates = [Candidate(Path(f"m{i}/{NAME}"), started_at=STARTED + 1000 + i, results={}) for i in range(n)]
        records = [Sidecar(SidecarState.ABSENT, Path(contract.SIDECAR_NAME))]
        records += [Sidecar(SidecarState.VALID, Path(f"s{i}"), trip={**record, "tripped_at": STARTED - i})
                    for i in range(n)]  # fmt: skip
        gc.disable()  # a collection in one timing and not the other is noise, not growth
        try:
            start = time.perf_counter()
            held = holdings(candidates, records)
            elapsed = time.perf_counter() - start
        finally:
            gc.enable()
        assert len(held.orphans) == n
        return elapsed

    # The least of several timings of each size: a preempted run (another test on the other core) is noise.
    small, large = min(seconds(1000) for _ in range(5)), min(seconds(8000) for _ in range(3))
    ratio = large / small
    assert ratio < 24, f"8x the records took {ratio:.1f}x the time (quadratic would be about 64x)"


def test_a_trip_record_in_a_model_directory_is_read(tmp_path: Path) -> None:
    # A sweep that sets RESULT_DIR to each model's output path: model A tripped and crashed
    # (its record in out/A, no results), model B is healthy. `read out/` must not say ok.
    (tmp_path / "A").mkdir()
    write_sidecar(tmp_path / "A", tripped_at=STARTED + 10, record={"run_id": RUN, "tasks": ["gsm8k"], "model": "A"})
    write_sidecar(tmp_path / "A", tripped_at=STARTED + 5, name=f"{contract.SIDECAR_NAME}.stale-5",
                  record={"run_id": "c" * 32 + ".3", "model": "A"})  # fmt: skip
    write_run(tmp_path, {"gsm8k": 0.9}, {"gsm8k": figures()}, run_id="b" * 32 + ".2", subdir="B", model_name="B",
              date=STARTED + 100)  # fmt: skip
    run = read(tmp_path, "--json")
    assert run.returncode == BELOW, run.stdout
    orphans = [v for v in json.loads(run.stdout) if v["results_file"] is None]
    assert sorted(v["trip_record"] for v in orphans) == [
        str(tmp_path / "A" / contract.SIDECAR_NAME),
        str(tmp_path / "A" / f"{contract.SIDECAR_NAME}.stale-5"),
    ]


def test_the_json_shape_with_task_is_an_object_for_one_verdict_and_a_list_for_several(tmp_path: Path) -> None:
    # main's rule, kept and documented: a re-run into the same path makes --task a list;
    # --newest gives back the one object.
    write_results(tmp_path, 0.9)
    assert isinstance(json.loads(read(tmp_path, "--json", "--task", "gsm8k").stdout), dict)
    write_results(tmp_path, 0.9, name="results_2026-11-30T02-00-00.000000.json", date=STARTED + 100)
    assert len(json.loads(read(tmp_path, "--json", "--task", "gsm8k").stdout)) == 2
    assert isinstance(json.loads(read(tmp_path, "--json", "--task", "gsm8k", "--newest").stdout), dict)


def test_newest_never_picks_one_of_two_files_of_the_same_run(tmp_path: Path) -> None:
    # InferenceX staged two files of one run (_conc4 and _conc4_1); the older says it was cut short.
    cut = figures(tripped=True, short_circuited=3)
    write_run(tmp_path, {"g": 0.0}, {"g": cut}, tripped=True, run_id=RUN, subdir=None,
              name="results_2026-11-30T01-00-00.000000_conc4.json")  # fmt: skip
    write_run(tmp_path, {"g": 0.9}, {"g": figures()}, run_id=RUN, subdir=None, date=STARTED + 1,
              name="results_2026-11-30T01-00-00.000000_conc4_1.json")  # fmt: skip
    run = read(tmp_path, "--newest")
    assert run.returncode == UNAVAILABLE, run.stdout
    assert "same run id" in run.stdout
