"""One table of exit codes: every command's --help and docs/cli.md show exactly it; the README shows read's."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support.procs import PYTHON

from probe import exitcodes

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CLI_DOCS = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
TABLES = {
    "read": exitcodes.READ,
    "patch": exitcodes.PATCH,
    "install": exitcodes.INSTALL,
    "run": exitcodes.RUN,
    "body": exitcodes.BODY,
    "demo": exitcodes.DEMO,
}


@pytest.mark.parametrize("command", sorted(TABLES))
def test_help_and_docs_show_the_table(command: str) -> None:
    text = exitcodes.epilog(TABLES[command])
    assert text in CLI_DOCS
    if command == "read":  # the README keeps the verdict's exit codes
        assert text in README
    shown = subprocess.run([PYTHON, "-m", "probe", command, "--help"], capture_output=True, text=True, check=True)
    for code, _ in TABLES[command]:
        assert f"  {'' if code is None else code:>3}  " in shown.stdout


def test_statuses_map_to_their_codes_explicitly() -> None:
    assert exitcodes.READ_STATUS == {"ok": 0, "below_floor": 1, "unavailable": 2}
    codes = [code for code, _ in exitcodes.READ]
    assert len(codes) == len(set(codes))


def test_an_internal_error_is_never_a_verdict(tmp_path: Path) -> None:
    # A results file the reader cannot handle would have crashed with exit 1 (below_floor).
    broken = "import sys, probe.cli as c; c._cmd_read = lambda a: 1 / 0; sys.exit(c.main(sys.argv[1:]))"
    run = subprocess.run([PYTHON, "-c", broken, "read", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == exitcodes.INTERNAL
    assert "ZeroDivisionError" in run.stderr and "internal error" in run.stderr


# "100001" and 4,000 nines: more documents than the demo writes (hostile round 27: it wrote its
# task file for ever, silently); 5,000 digits: more than int() takes.
@pytest.mark.parametrize(
    "value", ["0", "-4", "1_6", "\uff11\uff16", "\u0661\u0666", "16.0", "100001", "9" * 4000, "9" * 5000]
)
def test_demo_refuses_counts_that_are_not_plain_positive_integers(value: str) -> None:
    # int() takes "1_6" and non-ASCII digits as 16; nobody means them. (The unreachable
    # server only matters if the value were wrongly accepted.)
    command = [PYTHON, "-m", "probe", "demo", "--base-url", "http://127.0.0.1:9", f"--docs={value}"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == exitcodes.USAGE and "--docs" in run.stderr, (run.returncode, run.stderr[-500:])


def test_every_status_has_its_exit_code_and_its_line() -> None:
    from probe.reader.model import Status

    assert {status.value for status in Status} == set(exitcodes.READ_STATUS)
    lines = dict(exitcodes.READ)
    assert all(lines[exitcodes.READ_STATUS[status.value]].startswith(f"{status.value}:") for status in Status)
