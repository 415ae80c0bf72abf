"""Writing the sidecar: atomic, one-shot, first writer wins across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from probe.runtime import contract, sidecar

RACER = """
import json, os, sys, time
from probe.runtime.sidecar import write_sidecar_once
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
