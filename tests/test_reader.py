"""The reader: scores, sidecar states, verdicts, the contract, and `eval-probe read`."""

from __future__ import annotations

import json
import math
import subprocess
from fractions import Fraction
from pathlib import Path

import pytest
from support.procs import PYTHON, probe_site
from support.resultfiles import METRIC, figures, write_results, write_sidecar

from probe.demo.localtask import offline_env, task_name
from probe.reader.contract import contract_fingerprint, contract_settings
from probe.reader.render import describe
from probe.reader.scores import accuracy_meets_floor, finite_score
from probe.reader.sidecar import read_sidecar
from probe.reader.verdict import classify, classify_all
from probe.runtime.core import contract
from probe.runtime.core.contract import EVIDENCE_KEY

SIDECAR = contract.SIDECAR_NAME


@pytest.mark.parametrize(
    ("value", "expected"),
    [(0.0, 0.0), (0, 0.0), (1, 1.0), (0.25, 0.25), (-3.5, -3.5), (Fraction(1, 4), 0.25)],
)
def test_finite_score_accepts_finite_reals(value: object, expected: float) -> None:
    result = finite_score(value)
    assert result == expected and isinstance(result, float)


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -math.inf, True, False, "0.5", "nan", None, [0.5], {"a": 1}, 10**400, -(10**400),
     Fraction(10**400, 3)],
)  # fmt: skip
def test_finite_score_rejects_everything_else(value: object) -> None:
    assert finite_score(value) is None


def test_floor() -> None:
    assert accuracy_meets_floor(0.5, 0.5) and not accuracy_meets_floor(0.0, 0.01)
    assert accuracy_meets_floor(0.1, 0.2, higher_is_better=False) and not accuracy_meets_floor(0.3, 0.2, False)


@pytest.mark.parametrize(
    ("value", "status"),
    [(0.0, "below_floor"), (0.2, "below_floor"), (0.6, "ok"), (math.nan, "unavailable"), (math.inf, "unavailable"),
     ("0.7", "unavailable"), (True, "unavailable"), (None, "unavailable")],
)  # fmt: skip
def test_classify_scores(tmp_path, value: object, status: str) -> None:
    write_results(tmp_path, value)
    verdict = classify(tmp_path, floor=0.5)
    assert verdict.status == status
    assert verdict.score == (finite_score(value))
    json.dumps(verdict.to_json(), allow_nan=False)  # plain JSON, whatever the score was


def test_a_measured_zero_is_below_floor_not_unavailable(tmp_path) -> None:
    write_results(tmp_path, 0.0)
    verdict = classify(tmp_path, floor=0.01)
    assert (verdict.status, verdict.score, verdict.pathology) == ("below_floor", 0.0, None)


def test_missing_things_are_unavailable_with_a_reason(tmp_path) -> None:
    assert "no results file" in classify(tmp_path, 0.5).reason
    write_results(tmp_path, 0.9)
    assert "task 'mmlu'" in classify(tmp_path, 0.5, task="mmlu").reason
    assert "metric 'acc,none'" in classify(tmp_path, 0.5, metric="acc,none").reason


def test_corrupt_results_json_is_unavailable(tmp_path) -> None:
    path = write_results(tmp_path, 0.9)
    path.write_text('{"results": {"gsm8k": ')
    verdict = classify(tmp_path, 0.5)
    assert verdict.status == "unavailable" and "cannot read" in verdict.reason


def test_default_task_and_metric_are_reported(tmp_path) -> None:
    write_results(tmp_path, 0.9)
    verdict = classify(tmp_path, 0.5)
    assert (verdict.task, verdict.metric) == ("gsm8k", METRIC)


def test_a_tripped_run_is_below_floor_whatever_the_score(tmp_path) -> None:
    # An older probe's results file, without a run identity: the trip record is its own by time and model.
    cut = figures(cut_off=16, causes={"output_cap": 16}, finish_reasons={"length": 16}, observations=16,
                  short_circuited=24, tripped=True)  # fmt: skip
    older = {"schema_version": 1, "tripped": True, "tasks": {"gsm8k": cut}, "unattributed": None}
    write_results(tmp_path, 0.95, date=2.0, model_name="m", **{EVIDENCE_KEY: older})
    write_sidecar(tmp_path, tripped_at=3.0)
    verdict = classify(tmp_path, 0.5)
    assert verdict.status == "below_floor" and verdict.score == 0.95
    assert verdict.pathology["pathology"] == "non_terminating"
    assert verdict.pathology["short_circuited_requests"] == 1303
    text = describe(verdict)
    # 1303 short-circuited, 48 of them cancelled in flight: 1255 never reached the server.
    assert "16 of 16 generations" in text and "1255 requests were then answered with empty strings" in text


def test_a_tripped_run_without_results_is_still_explained(tmp_path) -> None:
    write_sidecar(tmp_path)
    verdict = classify(tmp_path, 0.5)
    assert verdict.status == "below_floor" and "no results file" in verdict.reason


def test_a_sidecar_older_than_the_run_is_stale_and_its_own_runs_verdict(tmp_path) -> None:
    write_results(tmp_path, 0.9, date=10_000.0, model_name="m")
    write_sidecar(tmp_path, tripped_at=1.0, record={"tasks": ["gsm8k"]})
    task, orphan = classify_all(tmp_path, 0.5)
    assert task.status == "ok" and task.sidecar.state == "stale"
    # The earlier run tripped and left no results: judged on its own, never hidden.
    assert (orphan.task, orphan.status, orphan.source.trip_record) == (None, "below_floor", tmp_path / SIDECAR)
    assert orphan.source.model == "m"
    # The newest-only view drops it: a later run of the same model ("m") re-ran its task.
    assert [v.status for v in classify_all(tmp_path, 0.5, newest_only=True)] == ["ok"]
    # Not when the later run holds another task, or the record does not say which it cut short.
    for tasks in (["gsm8k_cot"], None):
        write_sidecar(tmp_path, tripped_at=1.0, record={"tasks": tasks})
        assert [v.status for v in classify_all(tmp_path, 0.5, newest_only=True)] == ["ok", "below_floor"]


@pytest.mark.parametrize(
    "content",
    ["{not json", '{"schema_version": 1, "verdict": {"tripped": tr', json.dumps({"schema_version": 2, "verdict": {}}),
     json.dumps({"schema_version": 1, "verdict": {"tripped": "yes"}}), json.dumps([1, 2]), "\xff"],
)  # fmt: skip
def test_an_unreadable_sidecar_is_never_healthy_nor_absent(tmp_path, content: str) -> None:
    write_results(tmp_path, 0.9)
    (tmp_path / contract.SIDECAR_NAME).write_text(content, encoding="latin-1")
    assert read_sidecar(tmp_path).state == "unreadable"
    verdict = classify(tmp_path, 0.5)
    assert verdict.status == "unavailable" and "unreadable" in verdict.reason


def test_contract_follows_effective_values() -> None:
    defaults = contract_settings({})
    assert defaults == {
        "HYPERLOOM_EVAL_PROBE": True,
        "HYPERLOOM_EVAL_PROBE_MIN_SAMPLES": 16,
        "HYPERLOOM_EVAL_PROBE_LENGTH_RATIO": 0.75,
        "HYPERLOOM_EVAL_PROBE_MIN_MAX_TOKENS": 1024,
        "HYPERLOOM_EVAL_PROBE_SLOW_START": "auto",
        "HYPERLOOM_EVAL_PROBE_STREAM": "auto",
        "HYPERLOOM_EVAL_PROBE_DETECTOR": True,
        "HYPERLOOM_EVAL_PROBE_DETECTOR_NGRAM": 10,
        "HYPERLOOM_EVAL_PROBE_DETECTOR_WINDOW": 256,
        "HYPERLOOM_EVAL_PROBE_DETECTOR_DRIFT": 0.6,
        "HYPERLOOM_EVAL_PROBE_DETECTOR_THRESHOLD": 20.0,
        "HYPERLOOM_EVAL_PROBE_DETECTOR_REPEATS": 4,
    }
    assert contract_fingerprint({}) == contract_fingerprint({"HYPERLOOM_EVAL_PROBE_MIN_SAMPLES": "junk"})
    assert contract_fingerprint({}) == contract_fingerprint({"HYPERLOOM_EVAL_PROBE_MIN_SAMPLES": "16"})
    assert contract_fingerprint({}) != contract_fingerprint({"HYPERLOOM_EVAL_PROBE_MIN_SAMPLES": "32"})
    assert contract_fingerprint({}) != contract_fingerprint({"HYPERLOOM_EVAL_PROBE": "off"})
    assert contract_fingerprint({}) != contract_fingerprint({"HYPERLOOM_EVAL_PROBE_SLOW_START": "off"})
    assert contract_fingerprint({}) != contract_fingerprint({"HYPERLOOM_EVAL_PROBE_DETECTOR": "off"})
    assert contract_fingerprint({}) != contract_fingerprint({"HYPERLOOM_EVAL_PROBE_STREAM": "on"})


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory) -> dict[str, Path]:
    """Result directories from real lm-eval runs against the simulated server."""
    from probe.demo.localtask import write_task
    from probe.demo.simserver import SimServer

    root = tmp_path_factory.mktemp("runs")
    task = write_task(root / "task", 24)
    site = probe_site(root / "site")
    runs = {}
    for mode in ("healthy", "never_stop"):
        with SimServer(mode) as server:
            output = root / mode
            command = task.lm_eval_command(server.base_url, "sim", output, 2048, 8)
            run = subprocess.run(command, env=offline_env(site, RESULT_DIR=str(output)), capture_output=True)
            assert run.returncode == 0
            runs[mode] = output
    return runs


def read_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "probe", "read", *args], capture_output=True, text=True, timeout=60)


def test_read_on_real_runs(real_runs) -> None:
    healthy = read_cli(str(real_runs["healthy"]), "--floor", "0.5", "--json")
    assert healthy.returncode == 0
    assert [v["score"] for v in json.loads(healthy.stdout)] == [1.0]
    never = read_cli(str(real_runs["never_stop"]), "--floor", "0.5", "--task", task_name())
    assert never.returncode == 1
    assert "status:  below_floor" in never.stdout and "16 of 16 generations it observed" in never.stdout
    (as_json,) = json.loads(read_cli(str(real_runs["never_stop"]), "--json").stdout)
    assert as_json["score"] == 0.0 and as_json["pathology"]["short_circuited_requests"] == 8


def test_read_exit_codes(tmp_path) -> None:
    assert read_cli(str(tmp_path)).returncode == 2
    # A directory that is not there holds no results: unavailable (2), with the reason, never
    # a usage error (64), which a pipeline would read as its own mistake.
    missing = read_cli(str(tmp_path / "missing"), "--json")
    assert missing.returncode == 2 and "does not exist" in json.loads(missing.stdout)[0]["reason"]
    assert read_cli(str(tmp_path), "--floor", "high").returncode == 64


@pytest.mark.parametrize("floor", ["nan", "NaN", "inf", "-inf", "1e999", "1_0", "\uff11", "\u0661", " 0.5"])
def test_read_refuses_a_floor_that_is_not_a_plain_finite_number(tmp_path, floor: str) -> None:
    write_results(tmp_path, 0.9)
    run = read_cli(str(tmp_path), f"--floor={floor}")  # with '=', "-inf" is not taken for an option
    assert run.returncode == 64 and "--floor" in run.stderr and "finite" in run.stderr, (run.returncode, run.stderr)


@pytest.mark.parametrize("floor", ["0", "0.5", ".5", "-1", "+2", "1e-3", "5E+1"])
def test_read_accepts_plain_finite_floors(tmp_path, floor: str) -> None:
    write_results(tmp_path, 0.9)
    run = read_cli(str(tmp_path), "--floor", floor, "--json")
    assert [v["floor"] for v in json.loads(run.stdout)] == [float(floor)]


def test_classify_refuses_a_non_finite_floor(tmp_path) -> None:
    write_results(tmp_path, 0.9)
    with pytest.raises(ValueError, match="finite"):
        classify(tmp_path, math.nan)


def test_the_reader_imports_without_lm_eval(tmp_path) -> None:
    """The system Python has no lm-eval: the reader must not need it."""
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
        "from probe.reader.verdict import classify\nfrom probe.reader.contract import contract_fingerprint\n"
        f"print(classify({str(tmp_path)!r}, 0.5).status.value, 'lm_eval' in sys.modules)\n"
    )
    run = subprocess.run(["python3", "-c", code], capture_output=True, text=True, env=offline_env(None))
    assert run.stdout.split() == ["unavailable", "False"], run.stderr
