"""Writing the sidecar: atomic, one-shot, first writer wins across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from probe.runtime.core import contract, sidecar
from probe.runtime.scope import ownership

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

RACER = """
import json, os, sys, time
from probe.runtime.core.sidecar import write_sidecar_once
start = float(sys.argv[2])
while time.time() < start:
    pass
won = write_sidecar_once(sys.argv[1], {"verdict": {"pid": os.getpid()}, "padding": "x" * 200000})
print(json.dumps({"pid": os.getpid(), "won": won}))
"""


def test_one_shot(tmp_path: Path) -> None:
    path = str(tmp_path / contract.SIDECAR_NAME)
    assert sidecar.write_sidecar_once(path, {"n": 1}) is True
    assert sidecar.write_sidecar_once(path, {"n": 2}) is False
    assert json.loads(Path(path).read_text()) == {"n": 1}
    assert os.listdir(tmp_path) == [contract.SIDECAR_NAME]  # no temporary file left behind


def test_creates_a_missing_result_dir(tmp_path: Path) -> None:
    path = tmp_path / "not" / "yet" / contract.SIDECAR_NAME
    assert sidecar.write_sidecar_once(str(path), {"n": 1})
    assert json.loads(path.read_text()) == {"n": 1}


def test_unwritable_location_raises(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OSError):
        sidecar.write_sidecar_once(str(blocker / contract.SIDECAR_NAME), {"n": 1})


def test_processes_racing_leave_exactly_one_complete_sidecar(tmp_path: Path) -> None:
    path = tmp_path / contract.SIDECAR_NAME
    start = time.time() + 1.0
    racers = [
        subprocess.Popen([sys.executable, "-c", RACER, str(path), str(start)], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outcomes = [json.loads(p.communicate(timeout=60)[0]) for p in racers]
    winners = [o["pid"] for o in outcomes if o["won"]]
    assert len(winners) == 1
    assert json.loads(path.read_text())["verdict"]["pid"] == winners[0]


def test_rewrite_is_atomic_replace(tmp_path: Path) -> None:
    path = str(tmp_path / contract.SIDECAR_NAME)
    sidecar.write_sidecar_once(path, {"final": None})
    sidecar.write_json_atomic(path, {"final": {"short_circuited_requests": 3}})
    assert json.loads(Path(path).read_text())["final"]["short_circuited_requests"] == 3
    assert os.listdir(tmp_path) == [contract.SIDECAR_NAME]


def test_the_temporary_file_is_unpredictable_and_never_follows_a_planted_link(tmp_path: Path) -> None:
    path = tmp_path / contract.SIDECAR_NAME
    target = tmp_path / "victim"
    target.write_text("keep me")
    # The names the old code used: a planted link there was followed and overwritten.
    for name in (f".{contract.SIDECAR_NAME}.{os.getpid()}.{threading.get_ident()}.tmp",):
        (tmp_path / name).symlink_to(target)
    assert sidecar.write_sidecar_once(str(path), {"n": 1})
    sidecar.write_json_atomic(str(path), {"n": 2})
    assert target.read_text() == "keep me" and json.loads(path.read_text()) == {"n": 2}
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == [
        f".{contract.SIDECAR_NAME}.{os.getpid()}.{threading.get_ident()}.tmp"
    ]


def _trip(run_id: str, pid: int, when: float) -> dict:
    # A trip record that the one validator (sidecar.trip_record_problem) accepts.
    record = {"tripped": True, "pathology": contract.PATHOLOGY, "observations": 16, "pathological": 16,
              "finish_reasons": {"length": 16}, "max_tokens": [2048], "settings": {}}  # fmt: skip
    return {"schema_version": 1, "verdict": {**record, "run_id": run_id, "pid": pid, "tripped_at": when}, "final": None}


def test_a_paused_run_never_overwrites_the_next_runs_sidecar(tmp_path: Path) -> None:
    path = str(tmp_path / contract.SIDECAR_NAME)
    paused, nxt = ownership.SidecarOwnership(), ownership.SidecarOwnership()
    paused.claim(path, _trip("a" * 32 + ".1", 11, 100.0))
    # While it is paused, the next run moves its record aside and writes its own.
    assert "moved to" in nxt.claim(path, _trip("b" * 32 + ".2", 22, 200.0))
    where = paused.finalise({"short_circuited_requests": 5})
    assert json.loads(Path(path).read_text())["verdict"]["run_id"] == "b" * 32 + ".2"
    assert where != path and json.loads(Path(where).read_text())["final"] == {"short_circuited_requests": 5}


def test_another_process_of_the_same_run_is_followed_not_overwritten(tmp_path: Path) -> None:
    path = str(tmp_path / contract.SIDECAR_NAME)
    first, second = ownership.SidecarOwnership(), ownership.SidecarOwnership()
    first.claim(path, _trip("c" * 32 + ".3", 1, 1.0))
    assert "of this run" in second.claim(path, _trip("c" * 32 + ".3", 2, 2.0))
    assert second.finalise({"x": 1}) is None
    assert json.loads(Path(path).read_text())["verdict"]["pid"] == 1


LEAK = "d" * 32 + ".1"  # pid 1: an ancestor of every process


def test_an_evaluation_never_inherits_an_identity_and_its_children_do(tmp_path: Path) -> None:
    env = {contract.ENV_RUN_ID: LEAK}
    assert contract.run_id(dict(env)) == LEAK  # a worker of that run
    made = contract.run_id(env, fresh=True)  # an lm-eval evaluation starts its own run
    assert made != LEAK and env[contract.ENV_RUN_ID] == made and made.endswith(f".{os.getpid()}")
    child = subprocess.run(
        [sys.executable, "-c", "from probe.runtime.core import contract; print(contract.run_id())"],
        env={**os.environ, **env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert child.stdout.strip() == made
    # An identity whose maker is not an ancestor (leaked into a shell) is not honoured.
    stranger = {contract.ENV_RUN_ID: "e" * 32 + ".999999999"}
    assert contract.run_id(stranger) != "e" * 32 + ".999999999"


def test_another_runs_record_with_an_absurd_time_is_still_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / contract.SIDECAR_NAME
    path.write_text(json.dumps(_trip("a" * 32 + ".1", 1, 1e300)))
    mine = ownership.SidecarOwnership()
    assert "moved to" in mine.claim(str(path), _trip("b" * 32 + ".2", 2, 2.0))
    assert json.loads(path.read_text())["verdict"]["pid"] == 2
    assert [p.name for p in tmp_path.glob("*.stale-*")] == [f"{contract.SIDECAR_NAME}.stale-bad-time"]
