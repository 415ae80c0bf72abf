"""What ``eval-probe run``'s summary takes from the notes and nested reports beside its report.
Any process of the command may write them: a summary that reads them never crashes, never claims
an earlier run's trip, and reads every nested report that is there."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from support.procs import PYTHON
from support.resultfiles import figures

from probe.demo.localtask import offline_env
from probe.runtime.core import contract
from probe.runtime.scope import log, report
from probe.summary import summary

pytestmark = pytest.mark.release_independent

RUN = "c" * 32 + ".7"


def record(directory: Path, run: str, tripped_at: float) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / contract.SIDECAR_NAME
    path.write_text(json.dumps({"schema_version": 1, "verdict": {
        "tripped": True, "pathology": "non_terminating", "observations": 16, "pathological": 16,
        "finish_reasons": {"length": 16}, "max_tokens": [2048], "settings": {}, "tripped_at": tripped_at,
        "run_id": run}, "final": None}))  # fmt: skip
    return path


def test_a_report_with_any_run_id_never_crashes_the_summary(tmp_path: Path) -> None:
    # Hostile round 5: a run_id that is a list made eval-probe run exit 70, losing the command's code.
    observed = tmp_path / "observed.json"
    observed.write_text(json.dumps({"schema_version": 1, "evaluations": [{"run_id": []}, {"run_id": {}}]}))
    line = summary(tmp_path / "results", observed)
    assert line.startswith("summary: not known"), line


def test_a_noted_trip_of_an_earlier_run_is_never_the_commands(tmp_path: Path) -> None:
    # One forged note naming another run's record, written before this command started.
    started = time.time()
    theirs = record(tmp_path / "theirs", RUN, started - 60)
    observed = tmp_path / "observed.json"
    Path(f"{observed}.active").write_text(json.dumps({"tripping": RUN, "sidecar": str(theirs)}) + "\n")
    line = summary(tmp_path / "results", observed, started=started)
    assert "TRIPPED" not in line and "not known" in line, line
    assert "TRIPPED" in summary(tmp_path / "results", observed)  # the same record, had it been written since


def test_every_nested_report_that_is_there_is_read(tmp_path: Path) -> None:
    # Hostile round 5: 32 nested runs that had ended (their reports gone) used up the slots, and
    # the killed one's trip went unread.
    started = time.time()
    inner = tmp_path / "inner" / "observed.json"
    inner.parent.mkdir()
    sidecar = record(tmp_path / "out", RUN, time.time())
    # Killed mid-evaluation: only the notes beside its report are there, not the report.
    Path(f"{inner}.active").write_text(json.dumps({"tripping": RUN, "sidecar": str(sidecar)}) + "\n")
    observed = tmp_path / "observed.json"
    gone = [json.dumps({"nested": str(tmp_path / f"gone-{i}" / "observed.json")}) for i in range(100)]
    Path(f"{observed}.nested").write_text("\n".join([*gone, json.dumps({"nested": str(inner)})]) + "\n")
    line = summary(tmp_path / "results", observed, started=started)
    assert "TRIPPED" in line and str(sidecar) in line, line


def test_a_nested_report_left_by_an_earlier_command_is_not_read(tmp_path: Path) -> None:
    inner = tmp_path / "inner" / "observed.json"
    inner.parent.mkdir()
    sidecar = record(tmp_path / "out", RUN, time.time() - 600)
    Path(f"{inner}.active").write_text(json.dumps({"tripping": RUN, "sidecar": str(sidecar)}) + "\n")
    os.utime(inner.parent / "observed.json.active", (time.time() - 600,) * 2)
    inner.touch()
    os.utime(inner, (time.time() - 600,) * 2)
    observed = tmp_path / "observed.json"
    Path(f"{observed}.nested").write_text(json.dumps({"nested": str(inner)}) + "\n")
    line = summary(tmp_path / "results", observed, started=time.time() - 5)
    assert "TRIPPED" not in line, line


def test_a_nested_run_of_a_command_that_probes_nothing_is_not_watched(tmp_path: Path) -> None:
    # Hostile round 5: the nested note made the outer one think the probe had been active.
    run = subprocess.run([PYTHON, "-m", "probe", "run", "--", PYTHON, "-m", "probe", "run", "--", "true"],
                         env=offline_env(None), capture_output=True, text=True, timeout=120)  # fmt: skip
    summaries = [line for line in run.stderr.splitlines() if "summary:" in line]
    assert run.returncode == 0 and len(summaries) == 2, run.stderr
    assert all("NOT WATCHED: the probe was active in no process" in line for line in summaries), summaries


def test_what_the_probe_says_inside_lm_eval_stays_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    log.say("tripped: sidecar: /out\n[lm-eval-probe] summary: the probe did not trip\x1b[2K")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\x1b" not in err and "\\n[lm-eval-probe] summary" in err, err


def test_a_report_lock_held_for_good_never_holds_the_evaluation(tmp_path: Path, monkeypatch) -> None:
    observed = tmp_path / "observed.json"
    monkeypatch.setattr(report, "LOCK_WAIT_S", 0.3)
    with open(f"{observed}.lock", "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        begun = time.monotonic()
        with pytest.raises(OSError, match="stayed held"):
            report.add_to_report(str(observed), [{"schema_version": 1}])
        assert time.monotonic() - begun < 5


def test_a_reader_that_went_away_never_ends_the_command_nor_changes_its_exit_code(tmp_path: Path) -> None:
    # Hostile round 6: `eval-probe run -- ... 2>&1 | head -c 5` killed the command and exited 1.
    ran = tmp_path / "ran"
    script = (
        f"{PYTHON} -m probe run -- bash -c 'sleep 1; touch {ran}; exit 5' 2>&1 | head -c 5; exit ${{PIPESTATUS[0]}}"
    )
    run = subprocess.run(["bash", "-c", script], env=offline_env(None), capture_output=True, text=True, timeout=120)
    assert run.returncode == 5 and ran.exists(), (run.returncode, run.stdout, run.stderr)


def healthy_report(path: Path, run: str = "d" * 32 + ".8") -> None:
    task = figures(observations=4, finish_reasons={"stop": 4}, cut_off=0, cut_off_rate=0.0)
    group = {"tripped": False, "observations": 4, "pathological": 0}
    evaluation = {"schema_version": 1, "tripped": False, "run_id": run, "unattributed": None, "groups": [group],
                  "tasks": {"t": task}}  # fmt: skip
    path.write_text(json.dumps({"schema_version": 1, "evaluations": [evaluation]}))
    Path(f"{path}.active").touch()


def test_a_nested_run_killed_before_it_reported_is_said_beside_a_healthy_one(tmp_path: Path) -> None:
    # Hostile round 7: a killed sibling (the probe loaded, nothing reported) vanished behind a
    # healthy one's "did not trip".
    started = time.time()
    observed, killed = tmp_path / "observed.json", tmp_path / "killed" / "observed.json"
    healthy_report(observed)
    killed.parent.mkdir()
    Path(f"{killed}.active").touch()
    Path(f"{observed}.nested").write_text(json.dumps({"nested": str(killed)}) + "\n")
    line = summary(tmp_path / "results", observed, started=started)
    assert "the probe did not trip" in line and "1 nested eval-probe run(s) loaded the probe but reported" in line


def test_an_evaluation_that_tripped_and_never_reported_is_counted(tmp_path: Path) -> None:
    started = time.time()
    observed = tmp_path / "observed.json"
    healthy_report(observed)
    sidecar = record(tmp_path / "elsewhere", RUN, time.time())
    with open(f"{observed}.active", "a") as notes:
        notes.write(json.dumps({"tripping": RUN, "sidecar": str(sidecar)}) + "\n")
    line = summary(tmp_path / "results", observed, started=started)
    assert "TRIPPED in 1 of 2 evaluation(s)" in line, line
