"""The reader on results files that carry the probe's evidence: groups of tasks, crafted
entries, and text that must not forge what the table shows."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.procs import PYTHON
from support.resultfiles import STARTED, figures, write_run, write_sidecar

from probe import exitcodes
from probe.runtime.core.contract import EVIDENCE_KEY

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent


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
     {"cut_off": 41}, {"observations": True},
     {"observations": 10**18, "generate_requests": 10**18, "finish_reasons": {"length": 10**18}}],
    ids=["nan", "reasons-list", "caps-int", "negative", "more-cut-than-seen", "bool", "19-digits"],
)  # fmt: skip
def test_a_crafted_evidence_entry_is_unavailable_never_a_crash(tmp_path: Path, changes: dict) -> None:
    path = write_run(tmp_path, {"t": 0.9}, {"t": figures(empty_answers=30, tripped=True, **changes)}, tripped=True)
    path.write_text(path.read_text().replace('"NaN"', "NaN"))
    for args in ((), ("--json",)):
        run = read(tmp_path, *args)
        assert run.returncode == exitcodes.READ_STATUS["unavailable"], run.stderr[-1500:]
        assert "evidence" in run.stdout


@pytest.mark.parametrize("version", [True, 1.0, "1", 2, None])
def test_evidence_of_another_schema_is_unavailable(tmp_path: Path, version: object) -> None:
    # Exactly the integer 1, as the sidecar's (hostile round 25: true and 1.0 were read as 1).
    path = write_run(tmp_path, {"t": 0.9}, {"t": figures()})
    document = json.loads(path.read_text())
    document[EVIDENCE_KEY]["schema_version"] = version
    path.write_text(json.dumps(document))
    run = read(tmp_path, "--json")
    assert run.returncode == exitcodes.READ_STATUS["unavailable"], run.stderr[-1500:]
    assert "is not a schema-1 object" in run.stdout


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


def five_of_thirty() -> dict:
    return figures(generate_requests=30, observations=30, cut_off=5, causes={"output_cap": 5},
                   finish_reasons={"length": 5, "stop": 25})  # fmt: skip


def test_a_group_is_never_better_than_its_worst_task_caveats_included(tmp_path: Path) -> None:
    # Each subtask had 5 of 30 answers cut off: over --max-cap-rate 0.05.
    write_run(tmp_path, {"one": 0.8, "two": 0.8, "both": 0.8}, {"one": five_of_thirty(), "two": five_of_thirty()},
              group_subtasks={"both": ["one", "two"]})  # fmt: skip
    strict = read(tmp_path, "--task", "both", "--cap-rate-fails", "--json")
    assert strict.returncode == exitcodes.READ_STATUS["below_floor"], strict.stdout
    verdict = json.loads(strict.stdout)  # one verdict: one object, as before
    assert verdict["caveat"] and verdict["caveat"]["cut_off"] == 10 and verdict["caveat"]["observations"] == 60
    # Without --cap-rate-fails the group is ok, yet carries the caveat of its tasks.
    lenient = json.loads(read(tmp_path, "--task", "both", "--json").stdout)
    assert lenient["status"] == "ok" and lenient["caveat"]["bound"] == pytest.approx(0.8 + 10 / 60)


def test_a_group_carries_a_caveat_even_when_its_sums_are_under_the_rate(tmp_path: Path) -> None:
    # One of ten tasks is over the rate; the group's sums (5 of 300) are not.
    tasks = {f"t{i}": figures(generate_requests=30, observations=30) for i in range(9)} | {"t9": five_of_thirty()}
    write_run(tmp_path, {**{name: 0.8 for name in tasks}, "all": 0.8}, tasks, group_subtasks={"all": sorted(tasks)})
    strict = read(tmp_path, "--task", "all", "--cap-rate-fails", "--json")
    assert strict.returncode == exitcodes.READ_STATUS["below_floor"]
    assert "its task 't9'" in json.loads(strict.stdout)["reason"]


@pytest.mark.parametrize(
    ("changes", "tripped", "words"),
    [({"short_circuited": 84, "observations": 16}, False, "blanked by the probe"),
     ({"short_circuited": 84, "observations": 16}, True, "blanked by the probe"),
     ({"tripped": True, "short_circuited": 3}, False, "says nothing tripped"),
     ({"cancelled_in_flight": 5}, False, "cancelled in flight"),
     # Hand-edited counts no run can write (hostile round 19), each judged ok before.
     ({"observations": 400, "finish_reasons": {"stop": 400}}, False, "than it asked for"),
     ({"observations": 80, "finish_reasons": {"stop": 80}, "short_circuited": 30, "tripped": True}, True,
      "than it asked for"),
     ({"flagged": 300, "flagged_endings": {}}, False, "more flagged"),
     ({"finish_reasons": {"stop": 3}}, False, "finish reasons other than its observations"),
     ({"causes": {"output_cap": 30}}, False, "causes other than its cut-off"),
     ({"stop_at_cap": 500}, False, "'stop_at_cap'"),
     ({"below_min_max_tokens": 500}, False, "'below_min_max_tokens'"),
     ({"unknown_budget": 500}, False, "'unknown_budget'"),
     ({"below_min_max_tokens": 30, "unknown_budget": 30}, False, "under an unknown budget than it observed")],
    ids=["blanked-not-tripped", "blanked-task-not-tripped", "task-tripped-run-not", "cancelled-more-than-blanked",
         "observed-more-than-asked", "observed-and-blanked-more-than-asked", "flagged-more-than-answered",
         "reasons-not-observations", "causes-not-cut-off", "stops-at-cap-not-stops", "below-min-not-observed",
         "unknown-budget-not-observed", "unjudged-not-observed"],
)  # fmt: skip
def test_evidence_that_contradicts_itself_is_unavailable(tmp_path: Path, changes: dict, tripped: bool,
                                                         words: str) -> None:  # fmt: skip
    write_run(tmp_path, {"t": 0.9}, {"t": figures(generate_requests=100, **changes)}, tripped=tripped)
    run = read(tmp_path)
    assert run.returncode == exitcodes.READ_STATUS["unavailable"], run.stdout
    assert words in run.stdout


def test_a_task_the_trip_record_names_without_a_results_row_is_unavailable(tmp_path: Path) -> None:
    write_run(tmp_path, {"kept": 0.9}, {"kept": figures()}, tripped=False)
    write_sidecar(tmp_path, tripped_at=STARTED + 30, record={"run_id": "f" * 32 + ".1", "tasks": ["gone"]})
    (verdict, kept) = json.loads(read(tmp_path, "--json").stdout)
    assert (verdict["task"], verdict["status"]) == ("gone", "unavailable") and "contradicts" in verdict["reason"]
    assert kept["task"] == "kept"


def test_a_results_row_that_is_not_an_object_is_unavailable(tmp_path: Path) -> None:
    path = write_run(tmp_path, {"good": 0.9}, {})
    document = json.loads(path.read_text())
    document["results"]["odd"] = [0.9]
    path.write_text(json.dumps(document))
    run = read(tmp_path, "--json")
    assert run.returncode == exitcodes.READ_STATUS["unavailable"]
    assert {v["task"]: v["status"] for v in json.loads(run.stdout)} == {"odd": "unavailable", "good": "ok"}


def test_the_evidence_of_a_cut_short_task_counts_what_the_rule_counts(tmp_path: Path) -> None:
    # 10 generations at the cap and 6 the server aborted: the rule counts 10, never the aborts.
    cut = figures(observations=16, cut_off=16, causes={"output_cap": 10, "aborted": 6},
                  finish_reasons={"length": 10, "abort": 6}, short_circuited=24, tripped=True)  # fmt: skip
    write_run(tmp_path, {"t": 0.0}, {"t": cut}, tripped=True)
    (verdict,) = json.loads(read(tmp_path, "--json").stdout)
    assert verdict["pathology"]["pathological"] == 10 and verdict["pathology"]["observations"] == 16


def test_a_group_under_the_floor_still_says_its_task_was_cut_short(tmp_path: Path) -> None:
    cut = figures(cut_off=16, causes={"output_cap": 16}, finish_reasons={"length": 16}, observations=16,
                  short_circuited=24, tripped=True)  # fmt: skip
    write_run(tmp_path, {"well": 0.0, "sick": 0.0, "both": 0.0}, {"well": figures(), "sick": cut}, tripped=True,
              group_subtasks={"both": ["well", "sick"]})  # fmt: skip
    verdict = json.loads(read(tmp_path, "--task", "both", "--json").stdout)
    assert verdict["status"] == "below_floor" and verdict["pathology"]["observations"] == 16
    assert "its task 'sick' was cut short" in verdict["reason"] and verdict["cause"] == "non-termination: cut short"


@pytest.mark.parametrize("depth", [2, 300])
def test_a_deeply_nested_group_names_the_task_at_the_bottom_and_its_reason_does_not_grow(
    tmp_path: Path, depth: int
) -> None:
    cut = figures(cut_off=16, causes={"output_cap": 16}, finish_reasons={"length": 16}, observations=16,
                  short_circuited=24, tripped=True)  # fmt: skip
    groups = {f"g{i}": [f"g{i - 1}"] if i else ["t"] for i in range(depth)}
    write_run(tmp_path, {"t": 0.9, **dict.fromkeys(groups, 0.9)}, {"t": cut}, tripped=True, group_subtasks=groups)
    top = json.loads(read(tmp_path, "--task", f"g{depth - 1}", "--json").stdout)
    assert top["status"] == "below_floor" and top["reason"].startswith("its task 't' is below_floor (")
    assert len(top["reason"]) < 200
