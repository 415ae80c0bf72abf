"""Every row lm-eval's Hugging Face backend generates is observed once, in its own scope and
task, with the answer lm-eval keeps, however ``generate`` ends it.

In this process, on real ``HFLM.generate_until`` with the echo tiny Llama (it repeats a
prompt's last character, "x" forever, and stops at once after "~"), against the limits and
settings a user or a model's own files bring: a generation config with ``max_new_tokens``,
``max_time``, a ``think_end_token``, an evaluation's scope, one prompt object sent by two tasks.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from support.hf import echo_hflm, hf_requests

from probe.runtime import install
from probe.runtime.core import contract
from probe.runtime.core.answers import BlankAnswer
from probe.runtime.scope import state

pytestmark = pytest.mark.hf
MAX_TOKENS = 8
NEVER_STOP = ["p" * (12 - i) + "x" for i in range(8)]  # distinct lengths, all run to the cap


@pytest.fixture(scope="module")
def echo_lm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return echo_hflm(tmp_path_factory)


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[state.Probe]:
    """The probe installed on HFLM, rule unable to fire unless a test lowers MIN_SAMPLES."""
    monkeypatch.setenv(contract.ENV_MIN_MAX_TOKENS, "0")
    monkeypatch.setenv(contract.ENV_MIN_SAMPLES, "1000")
    monkeypatch.setenv("RESULT_DIR", str(tmp_path))
    assert install.install_hf()
    try:
        yield state.ACTIVE
    finally:
        install.uninstall()


def task_evidence(probe: state.Probe) -> dict[str, dict]:
    return probe.evidence_document()["tasks"]


def test_a_models_own_max_new_tokens_is_the_budget_its_rows_are_judged_by(echo_lm, monkeypatch, tmp_path) -> None:
    # transformers lets a generation config's max_new_tokens override lm-eval's max_length.
    monkeypatch.setattr(echo_lm.model.generation_config, "max_new_tokens", 5)
    monkeypatch.setattr(echo_lm, "batch_size_per_gpu", 2)
    monkeypatch.setenv(contract.ENV_MIN_SAMPLES, "4")
    monkeypatch.setenv(contract.ENV_MIN_MAX_TOKENS, "0")
    monkeypatch.setenv("RESULT_DIR", str(tmp_path))
    assert install.install_hf()
    try:
        probe = state.ACTIVE
        answers = echo_lm.generate_until(hf_requests(NEVER_STOP, max_gen_toks=MAX_TOKENS), disable_tqdm=True)
    finally:
        install.uninstall()
    task = task_evidence(probe)["probe_prompts"]
    assert task["observations"] == 4 and task["finish_reasons"] == {"length": 4}
    assert task["causes"]["output_cap"] == 4 and task["max_tokens"] == [5] and task["tripped"] is True
    assert [a for a in answers if not isinstance(a, BlankAnswer)] == ["xxxxx"] * 4


def test_rows_that_generate_ends_by_time_are_observed_not_lost(echo_lm, probed, monkeypatch) -> None:
    monkeypatch.setattr(echo_lm, "batch_size_per_gpu", 4)
    requests = hf_requests(NEVER_STOP, max_gen_toks=MAX_TOKENS, max_time=1e-6)
    answers = echo_lm.generate_until(requests, disable_tqdm=True)
    task = task_evidence(probed)["probe_prompts"]
    # Every row is observed once, as ended by the time limit: not the model's stop, not the cap.
    assert task["observations"] == len(NEVER_STOP) and task["finish_reasons"] == {"timeout": len(NEVER_STOP)}
    assert task["causes"]["output_cap"] == 0 and all(len(a) < MAX_TOKENS for a in answers)


def test_the_evidence_counts_the_answers_lm_eval_keeps_after_the_thinking(echo_lm, probed, monkeypatch) -> None:
    # With think_end_token "x", lm-eval keeps what follows the last "x": nothing.
    monkeypatch.setattr(echo_lm, "think_end_token", "x")
    monkeypatch.setattr(echo_lm, "batch_size_per_gpu", 3)
    answers = echo_lm.generate_until(hf_requests(NEVER_STOP, max_gen_toks=MAX_TOKENS), disable_tqdm=True)
    assert answers == [""] * len(NEVER_STOP)
    assert task_evidence(probed)["probe_prompts"]["empty_answers"] == len(NEVER_STOP)


def test_observations_go_to_the_evaluation_that_runs_them(echo_lm, probed, monkeypatch) -> None:
    # lm-eval's evaluator runs in a scope of its own (state.enter); the process's default
    # scope must see nothing of it.
    monkeypatch.setattr(echo_lm, "batch_size_per_gpu", 4)
    evaluation = state.Probe(probed.settings, evaluation=True)
    token = state.enter(evaluation)
    try:
        echo_lm.generate_until(hf_requests(NEVER_STOP, max_gen_toks=MAX_TOKENS), disable_tqdm=True)
    finally:
        state.leave(token, None, None)
    assert task_evidence(evaluation)["probe_prompts"]["observations"] == len(NEVER_STOP)
    assert "probe_prompts" not in task_evidence(probed)


def test_one_prompt_object_of_two_tasks_is_never_filed_under_the_wrong_one(echo_lm, probed, monkeypatch) -> None:
    # A one-character prompt is one object in CPython, whoever made it: lm-eval's batch tells
    # the probe its prompt, not which task's request it is.
    monkeypatch.setattr(echo_lm, "batch_size_per_gpu", 1)
    prompt = sys.intern("x")
    requests = hf_requests([prompt] * 3, task="long", max_gen_toks=MAX_TOKENS)
    requests += hf_requests([prompt] * 3, task="short", max_gen_toks=MAX_TOKENS // 2)
    answers = echo_lm.generate_until(requests, disable_tqdm=True)
    assert answers == ["x" * MAX_TOKENS] * 3 + ["x" * (MAX_TOKENS // 2)] * 3
    tasks = task_evidence(probed)
    for name, budget in (("long", MAX_TOKENS), ("short", MAX_TOKENS // 2)):
        assert tasks[name]["max_tokens"] in ([], [budget]), tasks  # observed as itself, or not at all
