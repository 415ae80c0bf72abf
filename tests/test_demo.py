"""`eval-probe demo`, the README's main job, at a small scale."""

from __future__ import annotations

import re
import subprocess

from support.procs import PYTHON

from probe.demo.localtask import offline_env


def test_demo_compares_unprobed_and_probed_runs(tmp_path) -> None:
    run = subprocess.run(
        [PYTHON, "-m", "probe", "demo", "--docs", "24", "--max-tokens", "1024", "--concurrency", "8"],
        env=offline_env(None, TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = {m[0]: m[1:] for m in re.findall(r"^\s*(unprobed|probed)\s+(\d+)\s+([\d,]+)", run.stdout, re.M)}
    assert rows["unprobed"] == ("24", "24,576")  # every request ran to the cap
    assert int(rows["probed"][0]) < 24 and int(rows["probed"][1].replace(",", "")) < 24_576
    assert "status:  below_floor" in run.stdout and "16 of 16 generations it observed" in run.stdout
