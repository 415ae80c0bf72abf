"""lm-eval's in-process vLLM backend (``--model vllm``), CPU build, tiny Llamas: the engine's
partial outputs. The loop detector's trip inside the engine, answers left as unprobed while the
probe watches, and parameters that forbid watching (what reaches the engine, and the watched copy
of the sampling parameters: tests/test_vllm_offline_start.py). Runs as tests/support/offline.py
describes; deselect with ``-m "not vllm"``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.offline import DOCS, MAX_NUM_SEQS, MAX_TOKENS, MIN_SAMPLES, evaluate, tiny_llamas
from support.procs import PYTHON
from support.resultfiles import written_by_lm_eval
from support.vllm import answers

from probe.demo.localtask import LocalTask, write_task
from probe.runtime.core import contract
from probe.runtime.core.contract import EVIDENCE_KEY

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> LocalTask:
    return write_task(tmp_path_factory.mktemp("task"), DOCS)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llamas(tmp_path_factory)


# Unprobed, the never-stopping model runs every generation to the cap, each answer MAX_TOKENS
# "a"s: vLLM's own count is then DOCS * MAX_TOKENS (tests/test_vllm_offline_start.py's engine
# that cannot be hooked runs it so, unprobed; tests/test_tiny_llama.py checks the model).
UNPROBED_ANSWER = "a" * MAX_TOKENS


def test_never_stopping_model_trips_inside_the_engine_and_saves_tokens(models, task, tmp_path) -> None:
    # The four-character token: 1,024 tokens are 1,024 of the detector's units, about what a BPE
    # tokenizer makes (with one character a token, 1,024 tokens are 256 units, too few for a flag
    # to become certain, at 512).
    run, probed = evaluate(models / "never_stop_wide", task, tmp_path / "probed", probed=True)
    assert "summary: TRIPPED (non_terminating)" in run.stderr
    sidecar = json.loads((tmp_path / "probed" / contract.SIDECAR_NAME).read_text())
    # The loop detector read the partial outputs: the trip came from its flags, before the
    # MIN_SAMPLES generations the cap rule waits for had all run to the cap. With 8 running
    # at once, the first wave's flags are not enough; the second wave's complete them.
    assert sidecar["verdict"]["cause"] == contract.REPETITION
    assert sidecar["verdict"]["flagged"] >= MIN_SAMPLES - MAX_NUM_SEQS
    assert probed["generation_tokens"] < MIN_SAMPLES * MAX_TOKENS
    assert sidecar["verdict"]["backend"] == "vllm" and sidecar["verdict"]["max_tokens"] == [MAX_TOKENS]
    assert sidecar["verdict"]["model"] == str(models / "never_stop_wide")
    # One LLM.generate call for the whole task: the slow start sent MIN_SAMPLES to the engine
    # (8 running, 8 queued), the rest never; whatever was in the engine unfinished at the trip
    # was aborted there, and lm-eval got a blank answer for each of those and of the rest.
    final = sidecar["final"]
    aborted, blanked = final["cancelled_in_flight"], final["short_circuited_requests"]
    assert 0 < aborted <= MAX_NUM_SEQS and blanked == DOCS - MIN_SAMPLES + aborted
    given = answers(tmp_path / "probed")
    assert sorted(given) == [""] * blanked + ["abcd" * MAX_TOKENS] * (DOCS - blanked)
    read = subprocess.run([PYTHON, "-m", "probe", "read", str(tmp_path / "probed"), "--json"], capture_output=True)
    (verdict,) = json.loads(read.stdout)
    assert read.returncode == 1 and verdict["status"] == "below_floor"
    assert verdict["results_file"] and Path(verdict["results_file"]).exists()
    # The per-task evidence travels in lm-eval's results file from this backend too.
    evidence = json.loads(Path(verdict["results_file"]).read_text())[EVIDENCE_KEY]
    assert evidence["backends"] == ["vllm"] and evidence["tasks"][verdict["task"]]["tripped"] is True
    assert evidence["tasks"][verdict["task"]]["cancelled_in_flight"] == aborted


def test_watched_partial_outputs_leave_every_answer_as_unprobed(models, tmp_path) -> None:
    # The probe asks the engine for cumulative outputs on its copy of the sampling parameters;
    # LLM.generate must still hand lm-eval what it hands it unprobed: 1,024-token answers,
    # assembled by the engine over many reports, two waves of them (each wave 1,024 engine
    # steps: CI time). More samples than documents: no trip.
    docs = 2 * MAX_NUM_SEQS
    small = write_task(tmp_path / "task", docs)
    knobs = {contract.ENV_MIN_SAMPLES: str(docs + 1)}
    run, probed = evaluate(models / "never_stop", small, tmp_path / "probed", probed=True, **knobs)
    assert "[lm-eval-probe] internal error" not in run.stderr
    assert "partial outputs cannot be watched" not in run.stderr
    assert answers(tmp_path / "probed") == [UNPROBED_ANSWER] * docs
    assert probed["generation_tokens"] == docs * MAX_TOKENS
    # ... while the detector did read them: it flagged every generation, which then ran to the cap.
    (results,) = written_by_lm_eval(tmp_path / "probed", "results_*.json")
    (evidence,) = json.loads(results.read_text())[EVIDENCE_KEY]["tasks"].values()
    assert evidence["flagged"] == docs and evidence["flagged_endings"] == {"length": docs}
    assert evidence["watched"] == docs


def test_parameters_that_forbid_partial_outputs_leave_the_cap_rule_as_before(models, tmp_path) -> None:
    # n=2: vLLM gathers a prompt's choices into one output only when it reports final outputs
    # only, so the probe leaves those parameters alone, says so once, and judges endings.
    # Two choices need sampling: babble's random letters never stop. A short budget, judged with
    # MIN_MAX_TOKENS lowered: the promise does not rest on its size (CI time).
    small = write_task(tmp_path / "task", MIN_SAMPLES)
    sampled, knobs = "n=2,temperature=1", {contract.ENV_MIN_MAX_TOKENS: "0"}
    run, _ = evaluate(
        models / "babble", small, tmp_path / "out", probed=True, gen_kwargs=sampled, max_tokens=128, **knobs
    )
    assert run.stderr.count("partial outputs cannot be watched (n=2 choices per prompt)") == 1
    assert "[lm-eval-probe] internal error" not in run.stderr
    assert "summary: TRIPPED (non_terminating)" in run.stderr
    sidecar = json.loads((tmp_path / "out" / contract.SIDECAR_NAME).read_text())
    # Judged by how the choices ended, all at the cap (two choices share one token count:
    # the cause is a length limit that cannot be told apart from the window).
    verdict = sidecar["verdict"]
    assert verdict["cause"] == contract.LENGTH and verdict["finish_reasons"] == {"length": verdict["observations"]}
