"""Probe.partial: a flag is one pathological observation (cause repetition), counted once,
that can trip a group before any generation ends; observe files how flagged ones ended."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from lm_eval.api.instance import Instance
from support.lm import completions, prompts
from support.probed import (
    GEN_KWARGS,
    HEALTHY,
    LOOP,
    MAX_TOKENS,
    loop_until_certain,
    loop_until_flagged,
    probe_with_requests,
    response,
)

from probe.runtime.core import contract
from probe.runtime.core.evidence import is_pathological
from probe.runtime.core.sidecar import trip_record_problem
from probe.runtime.scope.state import Probe


def test_a_flag_counts_once_and_its_ending_is_filed_apart(result_dir: Path) -> None:
    probe, (request, *_) = probe_with_requests(20)
    loop_until_flagged(probe, request)
    tally = request.group.tally
    assert (tally.observed, tally.pathological, tally.flagged, tally.causes[contract.REPETITION]) == (1, 1, 1, 1)
    for _ in range(50):  # more of the same loop, and then its ending, count nothing more
        probe.partial(request, 0, LOOP)
    probe.observe(request, response("length", MAX_TOKENS))
    assert (tally.observed, tally.pathological, tally.flagged) == (1, 1, 1)
    assert dict(tally.reasons) == {}  # a flag is no finish reason
    task = probe.evidence_document()["tasks"]["t"]
    assert task["flagged"] == 1 and task["flagged_endings"] == {"length": 1}
    # How it ended is also filed as any ending is: the per-task figures stay what the server said.
    assert task["observations"] == 1 and task["finish_reasons"] == {"length": 1} and task["causes"]["output_cap"] == 1
    assert request.labels == [contract.REPETITION] and is_pathological(request.labels[0])
    assert not request.group.tripped and not result_dir.exists()


def test_the_generations_the_detector_read_are_counted_whether_or_not_it_flagged_them(result_dir: Path) -> None:
    # Of four observed: one flagged, one read and not flagged, one whose stream carried only
    # empty text, one never streamed. The count is the denominator of a false-flag rate.
    probe, (flagged, read, empty, unread, *_) = probe_with_requests(20)
    loop_until_flagged(probe, flagged)
    probe.partial(read, 0, "The answer is 4")
    probe.partial(empty, 0, "")
    for request in (flagged, read, empty, unread):
        probe.observe(request, response("stop", 120))
    task = probe.evidence_document()["tasks"]["t"]
    assert (task["observations"], task["flagged"], task["watched"]) == (4, 1, 2)


def test_a_flagged_generation_that_then_stops_on_its_own_is_a_false_flag_withdrawn_from_the_rule(
    result_dir: Path,
) -> None:
    # A flag is provisional: the generation stopped before its budget, so it was no loop. The rule
    # and the slow start see a stop; the evidence files it as a false flag.
    probe, (request, *_) = probe_with_requests(20)
    loop_until_flagged(probe, request)
    assert request.group.tally.pathological == 1
    probe.observe(request, response("stop", 120))
    assert request.labels == ["stop"] and not is_pathological(request.labels[0])
    assert request.group.tally.pathological == 0 and request.group.tally.observed == 1
    assert request.group.tally.as_dict()["false_flags"] == 1
    task = probe.evidence_document()["tasks"]["t"]
    assert task["flagged_endings"] == {"stop": 1} and task["false_flags"] == 1 and task["cut_off"] == 0


@pytest.mark.parametrize(
    "reason", ["length", "max_tokens", "model_length", "insufficient_system_resource", "canceled", "eos_token", "stop"]
)
def test_a_flagged_generation_that_runs_to_the_cap_keeps_its_flag(result_dir: Path, reason: str) -> None:
    # Whatever the server calls the end at the budget: a stop there hides the cap, and any other
    # reason says nothing of the model. Only its own stop before the budget withdraws a flag.
    probe, (request, *_) = probe_with_requests(20)
    loop_until_flagged(probe, request)
    probe.observe(request, response(reason, MAX_TOKENS))
    assert request.labels == [contract.REPETITION] and request.group.tally.pathological == 1
    assert probe.evidence_document()["tasks"]["t"]["false_flags"] == 0


def test_min_samples_flags_trip_the_group_before_any_generation_ends(result_dir: Path) -> None:
    probe, requests = probe_with_requests(40)
    min_samples = probe.settings.min_samples

    async def main() -> list[asyncio.Task]:
        # Requests still in flight when the trip comes are cancelled, as at any trip.
        waiting = [asyncio.create_task(asyncio.sleep(60)) for _ in range(3)]
        for task, request in zip(waiting, requests[min_samples:], strict=False):
            request.group.inflight.add(task, request)
        await asyncio.sleep(0)
        for number, request in enumerate(requests[:min_samples], 1):
            loop_until_flagged(probe, request)
            assert not request.group.tripped  # a flag alone is provisional
            loop_until_certain(probe, request)
            assert request.group.tripped is (number == min_samples)
        await asyncio.gather(*waiting, return_exceptions=True)
        return waiting

    waiting = asyncio.run(main())
    assert all(task.cancelled() for task in waiting)
    assert all(r.cancelled_by_probe for r in requests[min_samples : min_samples + 3])
    sidecar = json.loads((result_dir / contract.SIDECAR_NAME).read_text())
    assert trip_record_problem(sidecar) is None
    record = sidecar["verdict"]
    assert (record["cause"], record["observations"], record["pathological"], record["flagged"]) == (
        contract.REPETITION, min_samples, min_samples, min_samples,
    )  # fmt: skip
    assert record["finish_reasons"] == {} and record["settings"][contract.ENV_DETECTOR] is True
    assert probe.evidence_document()["tasks"]["t"]["flagged"] == min_samples


def test_flags_and_endings_add_up_in_the_rule(result_dir: Path) -> None:
    # 12 loops flagged for certain and 4 generations at the cap: 16 observations, all pathological.
    probe, requests = probe_with_requests(40)
    for request in requests[:12]:
        loop_until_certain(probe, request)
    for request in requests[12:15]:
        probe.observe(request, response("length", MAX_TOKENS))
    assert not requests[0].group.tripped
    probe.observe(requests[15], response("length", MAX_TOKENS))
    assert requests[0].group.tripped
    record = json.loads((result_dir / contract.SIDECAR_NAME).read_text())["verdict"]
    assert (record["observations"], record["pathological"], record["flagged"]) == (16, 16, 12)
    assert record["cause"] == contract.REPETITION  # the cause counted most often
    assert record["causes"][contract.REPETITION] == 12 and record["causes"][contract.OUTPUT_CAP] == 4


def test_healthy_text_is_not_flagged_and_counts_at_its_ending(result_dir: Path) -> None:
    probe, (request, *_) = probe_with_requests(20)
    for start in range(0, len(HEALTHY), 3):
        probe.partial(request, 0, HEALTHY[start : start + 3])
    assert not request.flagged and request.group.tally.observed == 0
    probe.observe(request, response("stop", 60))
    tally = request.group.tally
    assert (tally.observed, tally.pathological, tally.flagged) == (1, 0, 0)
    assert request.labels == ["stop"] and not request.detectors  # its detector is dropped at the end


def test_only_the_flagged_choice_of_a_multi_prompt_request_is_counted_early(result_dir: Path) -> None:
    probe = Probe(contract.Settings(), evaluation=True)
    texts = prompts(2)
    probe.register(
        [Instance("generate_until", {}, (t, GEN_KWARGS), i, (("a", "b")[i], i, 1)) for i, t in enumerate(texts)]
    )
    request = probe.request(completions("http://127.0.0.1:9"), GEN_KWARGS, texts, MAX_TOKENS)
    loop_until_flagged(probe, request, index=1)
    probe.partial(request, 0, HEALTHY)
    probe.observe(request, response("length", MAX_TOKENS, n=2))
    tally = request.group.tally
    assert (tally.observed, tally.pathological, tally.flagged) == (2, 2, 1)
    tasks = probe.evidence_document()["tasks"]
    assert (tasks["a"]["flagged"], tasks["b"]["flagged"]) == (0, 1)
    assert tasks["b"]["flagged_endings"] == {"length": 1} and tasks["a"]["flagged_endings"] == {}


@pytest.mark.parametrize(
    "case", ["detector off", "below the rule's budget", "already observed", "not text", "not an index"]
)
def test_partial_is_a_no_op_where_it_promises_to_be(result_dir: Path, case: str, capsys) -> None:
    settings = contract.Settings(detector=case != "detector off")
    probe, (request, *_) = probe_with_requests(20, settings)
    index, delta = 0, LOOP
    if case == "below the rule's budget":
        request = probe.request(completions("http://127.0.0.1:9"), GEN_KWARGS, [prompts(1)[0]], 512)
    elif case == "already observed":
        probe.observe(request, response("stop", 10))
    elif case == "not text":
        delta = None  # type: ignore[assignment]
    elif case == "not an index":
        index = True  # type: ignore[assignment]
    before = request.group.tally.observed
    for _ in range(400):
        probe.partial(request, index, delta)
    assert not request.flagged and request.group.tally.observed == before and request.group.tally.flagged == 0
    assert "internal error" not in capsys.readouterr().err  # refused quietly, not by an error


def test_partial_never_raises_and_reports_its_own_error(result_dir: Path, capsys) -> None:
    probe, (request, *_) = probe_with_requests(20)
    request.detectors = None  # type: ignore[assignment]  # a broken request: the probe's own bug
    probe.partial(request, 0, LOOP)
    assert "internal error in partial" in capsys.readouterr().err


def test_the_detector_knobs_are_read_used_and_part_of_the_contract(result_dir: Path) -> None:
    environ = {
        contract.ENV_DETECTOR: "on", contract.ENV_DETECTOR_NGRAM: "4", contract.ENV_DETECTOR_WINDOW: "64",
        contract.ENV_DETECTOR_DRIFT: "0.25", contract.ENV_DETECTOR_THRESHOLD: "80", contract.ENV_STREAM: "off",
    }  # fmt: skip
    settings, warnings = contract.read_settings(environ)
    assert warnings == []
    assert (settings.detector_ngram, settings.detector_window, settings.detector_drift) == (4, 64, 0.25)
    assert (settings.detector_threshold, settings.stream) == (80.0, "off")
    assert set(environ) <= set(settings.as_dict())
    default = contract.Settings()
    assert (default.stream, default.detector) == ("auto", True)
    for name, raw in environ.items():
        changed = contract.read_settings({name: raw})[0]
        if changed != default:
            assert contract.settings_fingerprint(changed) != contract.settings_fingerprint(default), name
    assert contract.read_settings({contract.ENV_DETECTOR: "0"})[0].detector is False
    # The probe's detectors take the knobs: a loop of one unit is flagged at unit
    # ngram + ceil(threshold / (1 - drift)): 10 + 50 at the defaults, 4 + 107 here.
    for knobs, expected in ((default, 60), (settings, 111)):
        probe, (request, *_) = probe_with_requests(20, knobs)
        assert loop_until_flagged(probe, request, delta="ab ") == expected


def test_the_slow_start_credits_a_false_flag_as_the_stop_it_was(result_dir: Path) -> None:
    # The slow start lets more requests through for each answer that did not run to the cap;
    # a flagged generation that then stopped on its own was a stop.
    from probe.runtime.scope.gate import SlowStart

    probe, (flagged, plain, *_) = probe_with_requests(20)
    loop_until_flagged(probe, flagged)
    probe.observe(flagged, response("stop", 100))
    probe.observe(plain, response("stop", 100))
    budgets = []
    for request in (flagged, plain):
        policy = SlowStart.for_batch(64, probe.settings.min_samples, probe.settings.length_ratio, slow=True)
        before = policy.allowance
        policy.finished(True, request.labels, request.group.tripped, False)
        budgets.append(policy.allowance - before)
    assert budgets[0] == budgets[1] > 0


@pytest.mark.parametrize("name", [contract.ENV_DETECTOR_NGRAM, contract.ENV_DETECTOR_WINDOW])
def test_a_size_knob_too_large_to_hold_warns_and_keeps_the_default(result_dir: Path, name: str, capsys) -> None:
    # 2**64 units cannot size the detector's buffers: it was accepted silently, and every
    # generation's detector then failed with an internal error (the detector off, unsaid).
    settings, warnings = contract.read_settings({name: str(2**64)})
    assert settings == contract.Settings() and len(warnings) == 1 and name in warnings[0]
    probe, (request, *_) = probe_with_requests(20, settings)
    loop_until_flagged(probe, request)
    assert "internal error" not in capsys.readouterr().err


@pytest.mark.parametrize("index", [1, 5, -1])
def test_partial_for_a_choice_the_request_does_not_have_counts_nothing(result_dir: Path, index: int) -> None:
    # A one-prompt request has one choice, 0: a flag for another index was counted as an
    # observation of its own, and the request's real ending then counted its choice twice.
    probe, (request, *_) = probe_with_requests(20)
    for _ in range(400):
        probe.partial(request, index, LOOP)
    probe.observe(request, response("length", MAX_TOKENS))
    tally = request.group.tally
    assert (tally.observed, tally.flagged, request.flagged) == (1, 0, set())


def test_vllm_partial_outputs_are_asked_for_evidence_requests_only() -> None:
    # The in-process vLLM backend's sibling of the API path's rule: a request below
    # MIN_MAX_TOKENS is never analysed, so the engine need not report it every few tokens.
    from probe.runtime.core.streaming import wanted

    probe, (request, *_) = probe_with_requests(1)
    short = probe.request(completions("http://127.0.0.1:9"), {**GEN_KWARGS, "max_tokens": 256}, ["q"], 256)
    assert wanted(probe.settings, [request]) and not wanted(probe.settings, [short])
    assert not wanted(contract.Settings(detector=False), [request])
    assert not wanted(contract.Settings(stream="off"), [request])


FUNCTION = """def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
"""
CHORUS = (
    "And we sing, oh we sing, under the northern light tonight,\n"
    "holding on, holding on, till the morning makes it right.\n"
)


def _fed(probe: Probe, request, pieces: list[tuple[str, bool]], size: int = 7) -> bool:
    """Feed each (text, answering) piece in deltas of ``size`` characters; whether it was flagged."""
    for text, answering in pieces:
        for start in range(0, len(text), size):
            probe.partial(request, 0, text[start : start + size], answering)
    return 0 in request.flagged


@pytest.mark.parametrize("inline", [False, True])
def test_an_answer_that_restates_the_function_its_reasoning_drafted_is_not_a_loop(
    result_dir: Path, inline: bool
) -> None:
    """A reasoning model drafts a function, checks it, and gives it again as its answer (issue 34):
    with the reasoning streamed apart, or inline before </think>."""
    probe, (request, *_) = probe_with_requests(20)
    reasoning = "Let me write the function first.\n" + FUNCTION + "Checking: [3, 1, 2] gives 2. Good.\n"
    if inline:
        pieces = [(reasoning + "</think>\nThe final code:\n" + FUNCTION, False)]
    else:
        pieces = [(reasoning, False), ("The final code:\n" + FUNCTION, True)]
    assert not _fed(probe, request, pieces)


def test_code_shown_and_repeated_as_final_code_and_a_chorus_sung_twice_are_not_loops(result_dir: Path) -> None:
    probe, (code, song, *_) = probe_with_requests(20)
    assert not _fed(probe, code, [("Here is the code:\n" + FUNCTION + "Final code:\n" + FUNCTION, False)])
    verse = "The river knows the names of every town it passes by,\n"
    assert not _fed(probe, song, [(verse + CHORUS + verse.upper() + CHORUS + "And at the end:\n" + CHORUS, False)])


def test_a_block_that_keeps_repeating_is_a_loop(result_dir: Path) -> None:
    probe, (request, *_) = probe_with_requests(20)
    assert _fed(probe, request, [("Here is the code:\n" + FUNCTION * 6, False)])
