"""What a person sees of `eval-probe`: one list of commands, a closed pipe that is no error, prose
wrapped to the terminal."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.procs import PYTHON
from support.resultfiles import write_results, write_sidecar

from probe.cli import build_parser
from probe.terminal import wrap

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

FIXTURES = Path(__file__).parent / "fixtures"
COMMANDS = tuple(build_parser()._subparsers._group_actions[0].choices)


def test_the_top_level_help_lists_each_command_once() -> None:
    shown = subprocess.run([PYTHON, "-m", "probe", "--help"], capture_output=True, text=True, check=True).stdout
    for name in COMMANDS:
        rows = [line for line in shown.splitlines() if line.split()[:1] == [name] and line.startswith("  ")]
        assert len(rows) == 1, (name, rows)


def tripped_result_dir(directory: Path) -> Path:
    write_results(directory, 0.0)
    write_sidecar(directory, tripped_at=1_764_460_801.0)
    return directory


@pytest.mark.parametrize("args", [["body"], ["body", "--sources"], ["patch", "--dry-run", "LIB"], ["read", "DIR"]])
def test_a_reader_that_stops_reading_is_no_error(tmp_path: Path, args: list[str]) -> None:
    # `eval-probe body --sources | head -1`, made certain: the pipe is closed before anything is written.
    shutil.copytree(FIXTURES / "file", tmp_path / "tree")
    lib = str(tmp_path / "tree" / "benchmarks" / "benchmark_lib.sh")
    result = str(tripped_result_dir(tmp_path / "out"))
    command = [PYTHON, "-m", "probe", *(lib if a == "LIB" else result if a == "DIR" else a for a in args)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=120)
    expected = 1 if args[0] == "read" else 0  # read keeps its verdict (below_floor), the others succeed
    assert proc.returncode == expected and err == "", err


def test_prose_is_wrapped_to_the_terminal_and_left_whole_in_a_pipe(tmp_path: Path) -> None:
    result = str(tripped_result_dir(tmp_path / "out"))
    command = [PYTHON, "-m", "probe", "read", result]
    piped = subprocess.run(command, capture_output=True, text=True)
    [evidence] = [line for line in piped.stdout.splitlines() if line.startswith("evidence:")]
    assert len(evidence) > 200  # one line in a pipe: grep finds it whole

    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "60"}
    proc = subprocess.Popen(command, stdout=follower, stderr=subprocess.DEVNULL, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the other side has closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=120) == 1
    shown = b"".join(chunks).decode().replace("\r\n", "\n")
    # Only a word longer than the terminal (a result file's path) may stand alone on a longer line.
    assert all(len(line) <= 60 or " " not in line.strip() for line in shown.splitlines()), shown
    assert shown.split() == piped.stdout.split()  # the same words, only the breaks differ


WORDS = st.text(st.sampled_from("abc,.()-=_/"), min_size=1, max_size=30)
LINES = st.lists(st.tuples(st.integers(0, 6), st.lists(WORDS, max_size=40)), max_size=8)


@given(lines=LINES, width=st.integers(20, 120))
def test_wrap_keeps_every_word_in_order_and_fits_what_can_fit(lines: list, width: int) -> None:
    text = "\n".join(" " * indent + " ".join(words) for indent, words in lines)
    wrapped = wrap(text, width)
    assert wrapped.split() == text.split()
    for line in wrapped.split("\n"):
        assert len(line) <= width or " " not in line.strip()  # only a single long word may stick out
    for line in text.split("\n"):
        if len(line) <= width:
            assert line in wrapped.split("\n")
