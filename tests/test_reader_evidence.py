"""The reader on results files that carry the probe's evidence: groups of tasks, crafted
entries, and text that must not forge what the table shows."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.procs import PYTHON
from support.resultfiles import METRIC, write_results

from probe import exitcodes
from probe.runtime.contract import EVIDENCE_KEY

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent


def figures(**changes: object) -> dict:
    found = {
        "generate_requests": 40, "observations": 40, "finish_reasons": {"stop": 40}, "cut_off": 0,
        "cut_off_rate": 0.0, "causes": {"output_cap": 0}, "empty_answers": 0, "short_circuited": 0,
        "cancelled_in_flight": 0, "below_min_max_tokens": 0, "max_tokens": [2048], "tripped": False,
    }  # fmt: skip
    found.update(changes)
    return found


def evidence(tasks: dict, tripped: bool = False) -> dict:
    return {"schema_version": 1, "run_id": "f" * 32 + ".1", "tripped": tripped, "tasks": tasks, "unattributed": None}


def write_run(directory: Path, scores: dict[str, float], tasks: dict, tripped: bool = False, **extra) -> Path:
    path = write_results(directory, 0.0, **{EVIDENCE_KEY: evidence(tasks, tripped)}, **extra)
    document = json.loads(path.read_text())
    document["results"] = {name: {"alias": name, METRIC: score} for name, score in scores.items()}
    path.write_text(json.dumps(document))
    return path


def read(directory: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "probe", "read", str(directory), *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_a_groups_row_is_never_ok_when_one_of_its_tasks_was_cut_short(tmp_path: Path) -> None:
    cut = figures(cut_off=16, causes={"output_cap": 16}, finish_reasons={"length": 16}, observations=16,
                  short_circuited=24, tripped=True)  # fmt: skip
    write_run(tmp_path, {"well": 1.0, "sick": 0.0, "both": 0.5}, {"well": figures(), "sick": cut}, tripped=True,
              group_subtasks={"both": ["well", "sick"]})  # fmt: skip
    verdicts = {v["task"]: v for v in json.loads(read(tmp_path, "--json").stdout)}
    assert [verdicts[t]["status"] for t in ("well", "sick", "both")] == ["ok", "below_floor", "below_floor"]
    assert "its task 'sick'" in verdicts["both"]["reason"] and verdicts["both"]["pathology"]


def test_a_group_is_not_pulled_down_by_a_task_merely_under_the_floor(tmp_path: Path) -> None:
    write_run(tmp_path, {"easy": 1.0, "hard": 0.0, "both": 0.5}, {"easy": figures(), "hard": figures()},
              group_subtasks={"both": ["easy", "hard"]})  # fmt: skip
    verdicts = {v["task"]: v["status"] for v in json.loads(read(tmp_path, "--json").stdout)}
    assert verdicts == {"easy": "ok", "hard": "below_floor", "both": "ok"}


@pytest.mark.parametrize(
    "changes",
    [{"cut_off_rate": "NaN"}, {"finish_reasons": [1, 2]}, {"max_tokens": 5}, {"causes": {"output_cap": -1}},
     {"cut_off": 41}, {"observations": True}],
    ids=["nan", "reasons-list", "caps-int", "negative", "more-cut-than-seen", "bool"],
)  # fmt: skip
def test_a_crafted_evidence_entry_is_unavailable_never_a_crash(tmp_path: Path, changes: dict) -> None:
    path = write_run(tmp_path, {"t": 0.9}, {"t": figures(empty_answers=30, tripped=True, **changes)}, tripped=True)
    path.write_text(path.read_text().replace('"NaN"', "NaN"))
    for args in ((), ("--json",)):
        run = read(tmp_path, *args)
        assert run.returncode == exitcodes.READ_STATUS["unavailable"], run.stderr[-1500:]
        assert "evidence" in run.stdout


def test_a_task_name_cannot_forge_a_row_of_the_table(tmp_path: Path) -> None:
    forged = "sick\nwell  exact_match,strict-match  1  ok  0.0%  -"
    cut = figures(cut_off=16, causes={"output_cap": 16}, observations=16, tripped=True)
    write_run(tmp_path, {forged: 0.0}, {forged: cut}, tripped=True)
    run = read(tmp_path)
    assert run.returncode == 1
    assert not any(line.startswith("well") for line in run.stdout.splitlines()), run.stdout
    assert "sick\\nwell" in run.stdout


def test_the_caveat_of_an_error_rate_is_an_upper_bound(tmp_path: Path) -> None:
    cut = figures(cut_off=10, causes={"output_cap": 10}, cut_off_rate=0.25)
    write_run(tmp_path, {"t": 0.3}, {"t": cut})
    (verdict,) = json.loads(read(tmp_path, "--json", "--lower-is-better", "--floor", "0.5").stdout)
    assert verdict["caveat"]["bound"] == pytest.approx(0.05) and "an upper bound" in verdict["caveat"]["text"]


def test_reading_into_a_closed_pipe_is_not_an_internal_error(tmp_path: Path) -> None:
    write_run(tmp_path, {f"t{i}": 1.0 for i in range(2000)}, {})
    reader = subprocess.Popen([PYTHON, "-m", "probe", "read", str(tmp_path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)  # fmt: skip
    reader.stdout.readline()
    reader.stdout.close()
    assert reader.wait(timeout=60) == 0 and b"internal error" not in reader.stderr.read()
