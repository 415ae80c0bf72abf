"""End to end on lm-eval's Hugging Face backend (``--model hf``), on CPU, with tiny Llamas.

Each run is ``python -m lm_eval --model hf`` (through ``eval-probe run`` when probed), with
what transformers generated counted (scripts/lm_eval_hf_counted.py): decoding steps times
rows, so a batch that a trip ends early counts only the steps it ran. Slow (each run loads
torch and transformers): deselect with ``-m "not hf"``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.hf import evaluate_hf, in_batch_order, tiny_llamas, write_choice_task, write_prompts_task
from support.procs import PYTHON
from support.vllm import answers

from probe.demo.localtask import write_task
from probe.runtime.core import contract
from probe.runtime.core.contract import EVIDENCE_KEY

pytestmark = pytest.mark.hf
MAX_TOKENS = 64
DOCS = 48
BATCH = 8  # MIN_SAMPLES / BATCH batches reach the verdict
MIN_SAMPLES = contract.Settings().min_samples
# The tiny models' budgets are far below the default HYPERLOOM_EVAL_PROBE_MIN_MAX_TOKENS.
KNOBS = {contract.ENV_MIN_MAX_TOKENS: "0"}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llamas(("never_stop", "stops", "echo"), tmp_path_factory)


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    root = tmp_path_factory.mktemp("tasks")
    return write_task(root, DOCS), write_choice_task(root, 8)


def samples(output: Path, task: str) -> list[dict]:
    (found,) = output.glob(f"*/samples_{task}*.jsonl")
    return sorted((json.loads(line) for line in found.read_text().splitlines()), key=lambda r: r["doc_id"])


def evidence_of(output: Path) -> dict:
    (results,) = output.glob("*/results_*.json")
    return json.loads(results.read_text())[EVIDENCE_KEY]


def test_never_stopping_model_trips_after_the_verdict_and_leaves_loglikelihood_alone(models, tasks, tmp_path) -> None:
    generate, choice = tasks
    both = [generate.yaml, choice.yaml]
    _, unprobed = evaluate_hf(models / "never_stop", both, tmp_path / "plain", MAX_TOKENS, BATCH, False)
    run, probed = evaluate_hf(models / "never_stop", both, tmp_path / "probed", MAX_TOKENS, BATCH, True, **KNOBS)
    assert unprobed["generated_tokens"] == DOCS * MAX_TOKENS
    assert "summary: TRIPPED (non_terminating)" in run.stderr
    # Rows at the cap all end at their batch's last step: the trip comes at the end of the
    # batch that brings MIN_SAMPLES observations, and nothing of the group is generated after.
    assert probed["generated_tokens"] == MIN_SAMPLES * MAX_TOKENS
    assert probed["batch_rows"] == MIN_SAMPLES
    sidecar = json.loads((tmp_path / "probed" / contract.SIDECAR_NAME).read_text())
    assert sidecar["verdict"]["backend"] == "hf" and sidecar["verdict"]["model"] == str(models / "never_stop")
    assert sidecar["final"]["short_circuited_requests"] == DOCS - MIN_SAMPLES
    assert sidecar["final"]["cancelled_in_flight"] == 0
    given = answers(tmp_path / "probed", generate.name)
    assert sorted(given) == [""] * (DOCS - MIN_SAMPLES) + ["a" * MAX_TOKENS] * MIN_SAMPLES
    evidence = evidence_of(tmp_path / "probed")
    task = evidence["tasks"][generate.name]
    assert evidence["backends"] == ["hf"] and task["tripped"] is True
    assert task["finish_reasons"] == {"length": MIN_SAMPLES} and task["causes"]["output_cap"] == MIN_SAMPLES
    assert task["short_circuited"] == DOCS - MIN_SAMPLES and task["max_tokens"] == [MAX_TOKENS]
    # Loglikelihood: the same scores, request by request, and the probe saw none of it.
    assert choice.name not in evidence["tasks"]
    plain, probed_rows = samples(tmp_path / "plain", choice.name), samples(tmp_path / "probed", choice.name)
    assert [r["resps"] for r in probed_rows] == [r["resps"] for r in plain] and len(plain) == 8
    read = subprocess.run([PYTHON, "-m", "probe", "read", str(tmp_path / "probed"), "--task", generate.name, "--json"],
                          capture_output=True, text=True)  # fmt: skip
    verdict = json.loads(read.stdout)
    assert read.returncode == 1 and verdict["status"] == "below_floor" and verdict["pathology"]


def test_stopping_model_answers_as_unprobed_and_nothing_trips(models, tasks, tmp_path) -> None:
    generate, _ = tasks
    _, unprobed = evaluate_hf(models / "stops", [generate.yaml], tmp_path / "plain", MAX_TOKENS, BATCH, False)
    run, probed = evaluate_hf(models / "stops", [generate.yaml], tmp_path / "probed", MAX_TOKENS, BATCH, True, **KNOBS)
    assert f"the probe did not trip: 0 of {DOCS} generations observed were cut off" in run.stderr
    assert not (tmp_path / "probed" / contract.SIDECAR_NAME).exists()
    assert answers(tmp_path / "probed") == answers(tmp_path / "plain") == [" 7"] * DOCS
    # The same generation, padding included: the probe reorders lm-eval's batches, not their rows.
    assert probed == unprobed
    task = evidence_of(tmp_path / "probed")["tasks"][generate.name]
    assert task["observations"] == DOCS and task["finish_reasons"] == {"stop": DOCS} and task["cut_off"] == 0


def test_a_trip_inside_a_batch_ends_it_at_that_step(models, tmp_path) -> None:
    # The echo model repeats a prompt's last character: "x" forever, "~" is followed by EOS.
    # The probe runs lm-eval's batches in a seeded order (the texts are made to come in it):
    # the first batch runs to the cap (4 observations, below MIN_SAMPLES=5); in the second, the
    # "~" prompt stops at its first token, which makes 4 of 5 at the cap: the trip, at that step.
    batch = 4
    texts = in_batch_order("x" * batch + "~" + "x" * (2 * batch - 1), batch)
    task = write_prompts_task(tmp_path / "task", texts)
    knobs = {**KNOBS, contract.ENV_MIN_SAMPLES: "5"}
    run, probed = evaluate_hf(models / "echo", [task.yaml], tmp_path / "probed", MAX_TOKENS, batch, True, **knobs)
    assert "summary: TRIPPED (non_terminating)" in run.stderr
    assert probed["generated_tokens"] == batch * MAX_TOKENS + batch * 1  # the second batch ran one step
    assert probed["generate_calls"] == 2
    final = json.loads((tmp_path / "probed" / contract.SIDECAR_NAME).read_text())["final"]
    assert final["cancelled_in_flight"] == batch - 1 and final["short_circuited_requests"] == 2 * batch - 1
    # Unprobed, the echo model answers so (3 * batch * MAX_TOKENS tokens; no unprobed run here, CI
    # time: what it answers before the trip, below, is what it gives unprobed, or this test fails).
    plain = ["x" * MAX_TOKENS] * batch + [""] + ["x" * MAX_TOKENS] * (2 * batch - 1)
    # What finished before the trip keeps its answer; the rest is blank.
    assert answers(tmp_path / "probed") == plain[: batch + 1] + [""] * (2 * batch - 1)
    evidence = evidence_of(tmp_path / "probed")["tasks"][task.name]
    assert evidence["finish_reasons"] == {"length": batch, "stop": 1} and evidence["empty_answers"] == 1
    assert evidence["cancelled_in_flight"] == batch - 1


def test_blank_answers_never_reach_the_cache(models, tasks, tmp_path) -> None:
    generate, _ = tasks
    cache = str(tmp_path / "cache" / "lm")
    (tmp_path / "cache").mkdir()
    model, yaml = models / "never_stop", [generate.yaml]
    evaluate_hf(model, yaml, tmp_path / "probed", MAX_TOKENS, BATCH, True, "--use_cache", cache, **KNOBS)
    # Unprobed, from the same cache: the answers the model gave come back from it, and every
    # request the probe answered blank is generated again.
    _, again = evaluate_hf(model, yaml, tmp_path / "again", MAX_TOKENS, BATCH, False, "--use_cache", cache)
    assert again["generated_tokens"] == (DOCS - MIN_SAMPLES) * MAX_TOKENS
    assert answers(tmp_path / "again") == ["a" * MAX_TOKENS] * DOCS


def test_a_backend_that_cannot_be_hooked_runs_unprobed_with_one_message(models, tmp_path) -> None:
    # A pipeline's own patch of HFLM._model_generate, with another signature, made before the
    # probe installs (eval-probe run chains this sitecustomize.py first).
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "try:\n"
        "    import lm_eval.models.huggingface as hf\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    _original = hf.HFLM._model_generate\n"
        "    def _model_generate(self, context, stop, **kwargs):\n"
        "        return _original(self, context=context, stop=stop, **kwargs)\n"
        "    hf.HFLM._model_generate = _model_generate\n"
    )
    small = write_task(tmp_path / "task", MIN_SAMPLES)
    run, counts = evaluate_hf(
        models / "never_stop", [small.yaml], tmp_path / "out", MAX_TOKENS, BATCH, True, site=site, **KNOBS
    )
    assert run.stderr.count("[lm-eval-probe] could not install on lm_eval.models.huggingface") == 1
    assert "HFLM class is not as this probe knows it" in run.stderr
    assert "[lm-eval-probe] internal error" not in run.stderr
    assert counts["generated_tokens"] == MIN_SAMPLES * MAX_TOKENS
    assert not (tmp_path / "out" / contract.SIDECAR_NAME).exists()
    assert answers(tmp_path / "out") == ["a" * MAX_TOKENS] * MIN_SAMPLES
