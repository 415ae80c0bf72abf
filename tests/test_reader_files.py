"""The reader on real result directories: which files are results, which is the newest, and
hostile or unlucky files (deep, huge, special, linked out, from the future) that must end in
`unavailable` with a reason, never in a crash, a hang or another verdict."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.procs import PYTHON
from support.resultfiles import STARTED, write_results, write_sidecar

from probe import exitcodes
from probe.reader.verdict import classify, classify_all
from probe.runtime.core import contract

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

ISO = "2026-11-30T01-02-03.456789"


def read_cli(result_dir: Path, *args: str) -> subprocess.CompletedProcess:
    # A short timeout: a reader that blocks on what it finds fails the test instead of hanging it.
    command = [PYTHON, "-m", "probe", "read", str(result_dir), "--json", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=30)


def unavailable_because(result_dir: Path, *words: str) -> None:
    """``eval-probe read`` says unavailable (exit 2), and its reason names every one of ``words``
    (a last word ``--newest``: in the newest-only view)."""
    newest = words[-1:] == ("--newest",)
    run = read_cli(result_dir, *(("--newest",) if newest else ()))
    words = words[:-1] if newest else words
    assert run.returncode == exitcodes.READ_STATUS["unavailable"], (run.returncode, run.stdout, run.stderr[-2000:])
    verdicts = json.loads(run.stdout)  # without --task: one verdict per task, a list
    reason = " | ".join(v["reason"] for v in verdicts if v["status"] == "unavailable")
    for word in words:
        assert word in reason, reason


# --- Which file is the newest ---------------------------------------------------------------


def test_the_newest_is_the_latest_recorded_start_not_the_latest_name(tmp_path: Path) -> None:
    # Made at 10:00 local time in UTC+9, an hour before a run made at 02:00 local time in UTC+0.
    write_results(tmp_path, 0.9, name="results_2026-11-30T10-00-00.000000.json", date=STARTED)
    later = write_results(tmp_path, 0.9, name="results_2026-11-30T02-00-00.000000.json", date=STARTED + 3600)
    verdict = classify(tmp_path, 0.5, newest_only=True)
    assert (verdict.source.results_file, verdict.source.started_at) == (later, STARTED + 3600)


@pytest.mark.parametrize(
    "name",
    ["results_backup.json", "results.json", "results_latest.json", "meta_env.json", f"results_{ISO}.json.bak",
     f"samples_gsm8k_{ISO}.jsonl", f"results_{ISO}_conc64_copy.json", f"results_{ISO}_conc0.json",
     "results_\uff12\uff10\uff12\uff16-11-30T01-02-03.json"],
)  # fmt: skip
def test_names_neither_lm_eval_nor_inferencex_writes_are_not_results(tmp_path: Path, name: str) -> None:
    real = write_results(tmp_path, 0.1)
    write_results(tmp_path, 0.9, name=name, date=STARTED + 3600)
    verdict = classify(tmp_path, 0.5)
    assert (verdict.source.results_file, verdict.score) == (real, 0.1)


def test_inferencex_staged_names_are_results_with_their_concurrency(tmp_path: Path) -> None:
    # _stage_lm_eval_artifacts moved two runs at concurrency 64 (the second name was taken),
    # one at 8, and lm-eval wrote one with --output_path out.json; all flat in one directory.
    newest = write_results(tmp_path, 0.1, name=f"results_{ISO}_conc64.json", subdir=None, date=STARTED + 20)
    write_results(tmp_path, 0.9, name=f"results_{ISO}_conc64_2.json", subdir=None, date=STARTED + 10)
    write_results(tmp_path, 0.9, name=f"results_{ISO}_conc8.json", subdir=None, date=STARTED)
    write_results(tmp_path, 0.9, name="out_2026-11-30T01-02-03.json", subdir=None, date=STARTED - 10)
    (tmp_path / "meta_env.json").write_text("{}")
    from probe.reader.candidates import list_candidates

    found = sorted((c.path.name, c.concurrency, c.started_at, c.reason) for c in list_candidates(tmp_path))
    assert found == [
        ("out_2026-11-30T01-02-03.json", None, STARTED - 10, None),
        (f"results_{ISO}_conc64.json", 64, STARTED + 20, None),
        (f"results_{ISO}_conc64_2.json", 64, STARTED + 10, None),
        (f"results_{ISO}_conc8.json", 8, STARTED, None),
    ]
    # Every run, each concurrency's in the order they started; the exit code is the worst.
    verdicts = classify_all(tmp_path, 0.05)
    assert [(v.source.concurrency, v.source.results_file.name, v.status) for v in verdicts] == [
        (None, "out_2026-11-30T01-02-03.json", "ok"),
        (8, f"results_{ISO}_conc8.json", "ok"),
        (64, f"results_{ISO}_conc64_2.json", "ok"),
        (64, newest.name, "ok"),
    ]
    # --newest: one set of verdicts per concurrency, each from its own newest file.
    verdicts = classify_all(tmp_path, 0.05, newest_only=True)
    assert [(v.source.concurrency, v.source.results_file.name) for v in verdicts] == [
        (None, "out_2026-11-30T01-02-03.json"), (8, f"results_{ISO}_conc8.json"), (64, newest.name)]  # fmt: skip


@contextlib.contextmanager
def unprivileged() -> Iterator[None]:
    """Run the block without root's power to read anything (the tests may run as root)."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A result directory that an unprivileged user can reach (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="reader-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def test_an_unreadable_model_directory_makes_the_verdict_unavailable(shared_dir: Path) -> None:
    write_results(shared_dir, 0.9, subdir="model-a")
    write_results(shared_dir, 0.1, subdir="model-b", date=STARTED + 60)
    (shared_dir / "model-b").chmod(0)
    try:
        with unprivileged():
            verdict = classify(shared_dir, 0.5)
    finally:
        (shared_dir / "model-b").chmod(0o755)
    assert verdict.status == "unavailable"
    assert "model-b" in verdict.reason and "Permission denied" in verdict.reason


def test_an_unreadable_older_candidate_is_not_skipped(tmp_path: Path) -> None:
    write_results(tmp_path, 0.9, date=STARTED + 60)
    write_results(tmp_path, 0.1, name=f"results_{ISO}.json").write_text('{"results": ')
    unavailable_because(tmp_path, f"results_{ISO}.json", "not valid JSON")


@pytest.mark.parametrize(
    ("date", "words"),
    [(None, ["'date' is missing"]), ("2026-11-30", ["'date' is a str"]), (True, ["'date' is a bool"]),
     ("-Infinity", ["not a finite time"]), (10**400, ["not a finite time"]), (4e9, ["in the future"])],
)  # fmt: skip
def test_a_results_file_whose_start_time_cannot_be_trusted_is_unavailable(
    tmp_path: Path, date: object, words: list[str]
) -> None:
    path = write_results(tmp_path, 0.9)
    document = json.loads(path.read_text())
    document.pop("date") if date is None else document.update(date=date)
    text = json.dumps(document)
    path.write_text(text.replace('"-Infinity"', "-Infinity"))
    unavailable_because(tmp_path, *words)


def test_two_runs_of_one_slot_recording_the_same_start_cannot_be_ordered(tmp_path: Path) -> None:
    write_results(tmp_path, 0.9, subdir="model")
    write_results(tmp_path, 0.1, subdir="model", name=f"results_{ISO}.json")
    unavailable_because(tmp_path, "the same start time", f"results_{ISO}.json", "--newest")


# --- Hostile files ----------------------------------------------------------------------------

DEEP = "[" * 200_000 + "]" * 200_000


@pytest.mark.parametrize("where", ["results", "sidecar"])
def test_a_file_nested_200000_levels_deep_is_unavailable(tmp_path: Path, where: str) -> None:
    results = write_results(tmp_path, 0.9)
    if where == "results":
        results.write_text(results.read_text().replace('"alias": "gsm8k"', f'"alias": {DEEP}'))
    else:
        sidecar = write_sidecar(tmp_path, tripped_at=STARTED + 1, final="@")
        sidecar.write_text(sidecar.read_text().replace('"@"', DEEP))
    unavailable_because(tmp_path, "nested more than")


def test_a_file_nested_just_under_python_limit_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    # Deep enough to parse, too deep to print or walk safely: refused by the documented limit.
    write_results(tmp_path, json.loads("[" * 900 + "]" * 900))
    unavailable_because(tmp_path, "nested more than")


@pytest.mark.parametrize("digits", [400, 5000])
def test_a_huge_integer_score_is_not_a_finite_score(tmp_path: Path, digits: int) -> None:
    path = write_results(tmp_path, 0.5)
    path.write_text(
        path.read_text().replace('"exact_match,strict-match": 0.5', f'"exact_match,strict-match": {"9" * digits}')
    )
    run = read_cli(tmp_path, "--task", "gsm8k")
    assert run.returncode == exitcodes.READ_STATUS["unavailable"], run.stderr[-2000:]
    shown = json.loads(run.stdout)  # one verdict (400 digits), or the unreadable file and the missing task
    assert all(v["score"] is None for v in (shown if isinstance(shown, list) else [shown]))


def test_a_fifo_at_the_sidecar_path_is_unreadable_without_blocking(tmp_path: Path) -> None:
    write_results(tmp_path, 0.9)
    os.mkfifo(tmp_path / contract.SIDECAR_NAME)
    unavailable_because(tmp_path, "not a regular file")


def test_a_fifo_named_like_a_results_file_is_unavailable_without_blocking(tmp_path: Path) -> None:
    write_results(tmp_path, 0.9)
    os.mkfifo(tmp_path / "model" / f"results_{ISO}.json")
    unavailable_because(tmp_path, f"results_{ISO}.json", "not a regular file")


@pytest.mark.parametrize(
    ("tripped_at", "words"),
    [("-Infinity", ["non-finite"]), ("NaN", ["non-finite"]), ("1e999", ["non-finite"]), (True, ["tripped_at"]),
     (4e9, ["in the future"]),
     # Integers no float holds (hostile round 25: float() raised OverflowError, exit 70).
     ("1" + "0" * 400, ["not finite"]), ("-1" + "0" * 400, ["not finite"])],
)  # fmt: skip
def test_a_sidecar_whose_trip_time_cannot_be_trusted_is_unreadable(
    tmp_path: Path, tripped_at: object, words: list[str]
) -> None:
    write_results(tmp_path, 0.9)
    path = write_sidecar(tmp_path, tripped_at="@")  # type: ignore[arg-type]
    path.write_text(path.read_text().replace('"@"', json.dumps(tripped_at).strip('"')))
    unavailable_because(tmp_path, "sidecar is unreadable", *words)


@pytest.mark.parametrize("tripped_at", ["1" + "0" * 400, "-1" + "0" * 400, "NaN"])
def test_a_record_moved_aside_whose_trip_time_cannot_be_trusted_is_unreadable(tmp_path: Path, tripped_at: str) -> None:
    # The runtime moves such a record aside (it cannot be this run's), and the reader reads it too.
    write_results(tmp_path, 0.9)
    path = write_sidecar(tmp_path, tripped_at="@", name=contract.SIDECAR_NAME + ".stale-bad-time")  # type: ignore[arg-type]
    path.write_text(path.read_text().replace('"@"', tripped_at))
    unavailable_because(tmp_path, "trip record cannot be read", "finite")


def test_a_sidecar_with_a_non_finite_number_anywhere_is_unreadable(tmp_path: Path) -> None:
    # The probe never writes one; printed with --json it would not even be JSON.
    write_results(tmp_path, 0.9)
    path = write_sidecar(tmp_path, tripped_at=STARTED + 1)
    path.write_text(path.read_text().replace('"seconds_since_first_request": 70.1', '"ratio": NaN'))
    unavailable_because(tmp_path, "sidecar is unreadable", "non-finite")


def test_a_sidecar_with_an_integer_python_cannot_parse_is_unreadable(tmp_path: Path) -> None:
    # Over Python's 4300-digit limit for int(): a ValueError that is not a JSONDecodeError.
    write_results(tmp_path, 0.9)
    path = write_sidecar(tmp_path, tripped_at=STARTED + 1)
    path.write_text(path.read_text().replace('"observations": 16', f'"observations": {"9" * 5000}'))
    unavailable_because(tmp_path, "sidecar is unreadable")


@pytest.mark.parametrize("where", ["results", "sidecar"])
def test_a_file_over_the_size_bound_is_unavailable(tmp_path: Path, where: str) -> None:
    from probe.reader.candidates import MAX_RESULTS_BYTES
    from probe.reader.sidecar import MAX_SIDECAR_BYTES

    path = write_results(tmp_path, 0.9) if where == "results" else write_sidecar(tmp_path, tripped_at=STARTED + 1)
    with path.open("r+b") as handle:  # sparse: large on paper, nothing written
        handle.truncate((MAX_RESULTS_BYTES if where == "results" else MAX_SIDECAR_BYTES) + 1)
    unavailable_because(tmp_path, "bytes")


def test_a_sidecar_linked_from_outside_the_result_directory_is_unreadable(tmp_path: Path) -> None:
    result_dir = tmp_path / "run"
    write_results(result_dir, 0.9)
    elsewhere = write_sidecar(tmp_path, tripped_at=STARTED + 1)
    (result_dir / contract.SIDECAR_NAME).symlink_to(elsewhere)
    unavailable_because(result_dir, "sidecar is unreadable", "outside the result directory")


def test_a_sidecar_linked_from_inside_the_result_directory_is_read(tmp_path: Path) -> None:
    write_results(tmp_path, 0.9)
    inside = write_sidecar(tmp_path, tripped_at=STARTED + 1).rename(tmp_path / "model" / "evidence.json")
    (tmp_path / contract.SIDECAR_NAME).symlink_to(inside)
    assert classify(tmp_path, 0.5).status == "below_floor"


def test_a_dangling_sidecar_link_is_unreadable_not_absent(tmp_path: Path) -> None:
    write_results(tmp_path, 0.9)
    (tmp_path / contract.SIDECAR_NAME).symlink_to(tmp_path / "gone.json")
    unavailable_because(tmp_path, "sidecar is unreadable")


@pytest.mark.parametrize("link", ["model directory", "results file"])
def test_results_linked_from_outside_the_result_directory_are_unavailable(tmp_path: Path, link: str) -> None:
    result_dir, outside = tmp_path / "run", tmp_path / "elsewhere"
    write_results(result_dir, 0.1)
    source = write_results(outside, 0.9, date=STARTED + 60)
    if link == "model directory":
        (result_dir / "other-model").symlink_to(source.parent, target_is_directory=True)
    else:
        (result_dir / "model" / f"results_{ISO}.json").symlink_to(source)
    unavailable_because(result_dir, "outside the result directory")


def test_run_summary_does_not_block_on_a_fifo_sidecar(tmp_path: Path) -> None:
    # `eval-probe run` reads the sidecar the same way to print its summary line.
    os.mkfifo(tmp_path / contract.SIDECAR_NAME)
    code = (
        "import sys; from pathlib import Path; from probe.summary import summary\n"
        "print(summary(Path(sys.argv[1]), Path(sys.argv[1]) / 'none'))"
    )
    run = subprocess.run([PYTHON, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=30)
    assert "the sidecar is unreadable" in run.stdout and "not a regular file (a FIFO)" in run.stdout, run.stderr
