"""The reader on runs where the loop detector flagged generations: the cause, the figures the
rule counted, the detector's precision line, and flagged evidence that contradicts itself."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from support.lm import completions, prompts
from support.procs import PYTHON
from support.resultfiles import METRIC, figures, write_run

from probe import exitcodes
from probe.runtime.core import contract
from probe.runtime.scope.state import Probe

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

GEN_KWARGS = {"until": ["\n\n"], "max_tokens": 4096, "temperature": 0}
LOOP = "so the answer is 42 and so "


def read(directory: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "probe", "read", str(directory), *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def _probe() -> tuple[Probe, list]:
    """A probe with 40 requests of task "t", as lm-eval's requests reach it."""
    from lm_eval.api.instance import Instance

    probe = Probe(contract.Settings(), evaluation=True)
    texts = prompts(40)
    probe.register([Instance("generate_until", {}, (t, GEN_KWARGS), i, ("t", i, 1)) for i, t in enumerate(texts)])
    lm = completions("http://127.0.0.1:9")
    return probe, [probe.request(lm, GEN_KWARGS, [text], 4096) for text in texts]


def _run(result_dir: Path, flag: int, stop_after_flag: int = 0) -> Probe:
    """A probe that saw ``flag`` looping generations of task "t" (the first ``stop_after_flag``
    of them then ended with a stop; the others still run)."""
    probe, requests = _probe()
    for request in requests[:flag]:
        while not request.certain:  # a flag counts for the rule once certain
            probe.partial(request, 0, LOOP)
    for request in requests[:stop_after_flag]:
        probe.observe(request, {"choices": [{"index": 0, "text": "42", "finish_reason": "stop"}]})
    if requests[0].group.tripped:
        for request in requests[flag:]:
            probe.blanks(request)
    return probe


def _write_results(result_dir: Path, probe: Probe, score: float) -> None:
    document = {
        "results": {"t": {"alias": "t", METRIC: score}},
        "date": (probe.groups.first_request_at or time.time()) - 5,
        contract.EVIDENCE_KEY: probe.evidence_document(),
    }
    path = result_dir / "model" / "results_2026-12-01T12-00-00.000000.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))


def test_a_run_the_flags_tripped_reads_as_cut_short_by_repetition(result_dir: Path) -> None:
    probe = _run(result_dir, flag=16)
    assert probe.groups.first_request_at and next(iter(probe.groups)).tripped
    _write_results(result_dir, probe, 0.0)
    run = read(result_dir, "--json")
    assert run.returncode == exitcodes.READ_STATUS["below_floor"], run.stdout
    (verdict,) = json.loads(run.stdout)
    found = verdict["pathology"]
    assert (found["cause"], found["flagged"], found["pathological"], found["observations"]) == (
        contract.REPETITION, 16, 16, 16,
    )  # fmt: skip
    assert verdict["evidence"]["flagged"] == 16 and verdict["evidence"]["flagged_endings"] == {}
    assert verdict["cause"] == "repetition: cut short"
    text = read(result_dir, "--task", "t").stdout
    assert "(finish reasons: 16 flagged looping before they ended)" in text
    assert "loop detector: 16 generations flagged looping before they ended; none of them had ended" in text
    assert "were seen looping" in text  # the cause, in the glossary's words


def test_the_detectors_precision_is_read_off_a_healthy_run(result_dir: Path) -> None:
    # Two flags the model then proved wrong by stopping: too few to trip; the line says so.
    probe = _run(result_dir, flag=2, stop_after_flag=2)
    _write_results(result_dir, probe, 0.9)
    run = read(result_dir, "--task", "t")
    assert run.returncode == exitcodes.READ_STATUS["ok"], run.stdout
    assert "loop detector: 2 generations flagged looping before they ended; 2 of them then ended (stop=2); " in (
        run.stdout
    )
    assert "2 stopped by themselves" in run.stdout
    (verdict,) = json.loads(read(result_dir, "--json").stdout)
    assert verdict["evidence"]["flagged_endings"] == {"stop": 2}


def test_without_the_trip_record_the_results_file_counts_what_the_rule_counted(tmp_path: Path) -> None:
    # 12 flags (4 of which then ran to the cap) and 4 other generations at the cap: the rule
    # counted 16 observations, 16 pathological, most of them for repetition.
    cut = figures(observations=8, cut_off=8, causes={"output_cap": 8}, finish_reasons={"length": 8},
                  flagged=12, flagged_endings={"length": 4}, short_circuited=24, tripped=True)  # fmt: skip
    write_run(tmp_path, {"t": 0.0}, {"t": cut}, tripped=True)
    (verdict,) = json.loads(read(tmp_path, "--json").stdout)
    found = verdict["pathology"]
    assert (found["observations"], found["pathological"], found["flagged"]) == (16, 16, 12)
    assert found["cause"] == contract.REPETITION


@pytest.mark.parametrize(
    "changes",
    [{"flagged": -1, "flagged_endings": {}}, {"flagged": 1, "flagged_endings": {"stop": 2}},
     {"flagged": "3", "flagged_endings": {}}, {"flagged": 3, "flagged_endings": [1]},
     {"flagged_endings": {"stop": 1}}, {"flagged": 5, "flagged_endings": {"length": 5}},
     {"flagged": 3, "flagged_endings": {"stop": 2, "length": 1}},
     {"flagged": 0, "flagged_endings": {}, "watched": -1}, {"flagged": 0, "flagged_endings": {}, "watched": 41},
     {"flagged": 2, "flagged_endings": {"stop": 2}, "watched": 1}],
    ids=["negative", "more-endings-than-flags", "not-a-count", "endings-not-counts", "endings-without-count",
         "endings-never-filed-as-endings", "an-ending-beyond-its-finish-reason", "watched-negative",
         "watched-more-than-observed", "watched-fewer-than-flagged-endings"],
)  # fmt: skip
def test_flagged_evidence_that_cannot_be_true_is_unavailable(tmp_path: Path, changes: dict) -> None:
    write_run(tmp_path, {"t": 0.9}, {"t": figures(**changes)})
    run = read(tmp_path)
    assert run.returncode == exitcodes.READ_STATUS["unavailable"], run.stdout
    assert "flagged" in run.stdout


@pytest.mark.parametrize(("watched", "said"), [(12, "it read 12 of the 40"), (0, "it read 0 of the 40")])
def test_how_many_generations_the_detector_read_is_said_when_it_flagged_none(
    tmp_path: Path, watched: int, said: str
) -> None:
    # "flagged 0" is worth what the detector read: 12 of 40 (a few streamed), or none (nothing
    # streamed: the cap rule alone judged).
    write_run(tmp_path, {"t": 0.9}, {"t": figures(flagged=0, flagged_endings={}, watched=watched)})
    run = read(tmp_path, "--task", "t")
    assert run.returncode == exitcodes.READ_STATUS["ok"], run.stdout
    assert f"loop detector: no generation flagged; {said} generations observed as they came" in run.stdout
    (verdict,) = json.loads(read(tmp_path, "--json").stdout)
    assert verdict["evidence"]["watched"] == watched


@pytest.mark.parametrize("watched", ["many", None, [1], True, 10**6], ids=["text", "null", "list", "bool", "huge"])
def test_a_watched_count_that_cannot_be_true_is_unavailable_in_a_group_too(tmp_path: Path, watched: object) -> None:
    # Hand-edited evidence: one task of a group has an odd "watched" and no flagged counts. The
    # reader added it up for the group (a crash, exit 70) or said "read 1000004 of the 16".
    healthy, odd = figures(flagged=0, flagged_endings={}, watched=4), figures(watched=watched)
    write_run(tmp_path, {"a": 0.9, "b": 0.9, "grp": 0.9}, {"a": healthy, "b": odd},
              group_subtasks={"grp": ["a", "b"], "a": [], "b": []})  # fmt: skip
    for task in ("grp", "b"):
        run = read(tmp_path, "--task", task)
        assert run.returncode == exitcodes.READ_STATUS["unavailable"], run.stdout + run.stderr
        assert "the probe's evidence for task 'b'" in run.stdout and "watched" in run.stdout


def test_flagged_stops_at_a_hidden_cap_are_not_read_as_stopped_by_themselves(tmp_path: Path) -> None:
    # A server that reports the cap as "stop": 10 flagged generations ran to it (stop_at_cap,
    # cause output cap). The line said "10 stopped by themselves (flags the model proved wrong)".
    cut = figures(finish_reasons={"stop": 40}, stop_at_cap=10, cut_off=10, causes={"output_cap": 10},
                  flagged=10, flagged_endings={"stop": 10})  # fmt: skip
    write_run(tmp_path, {"t": 0.5}, {"t": cut})
    text = read(tmp_path, "--task", "t").stdout
    assert "stopped by themselves" not in text, text
    assert "10 of them then ended (stop=10)" in text and "up to 10 of the stops may be at the max_tokens" not in text
    assert "10 of the stops may be at the budget's end" in text


@pytest.mark.parametrize(("reason", "tokens", "status"), [("eos_token", 4096, "below_floor"), ("end_turn", 80, "ok")])
def test_a_stop_spelled_as_its_server_spells_it_reads_as_the_probe_filed_it(
    result_dir: Path, reason: str, tokens: int, status: str
) -> None:
    # A stop reason at the budget is the cap (a server that hides it); below, the model's own stop.
    probe, requests = _probe()
    for request in requests[:16]:
        probe.observe(request, {"choices": [{"index": 0, "text": "x", "finish_reason": reason}],
                                "usage": {"completion_tokens": tokens}})  # fmt: skip
    _write_results(result_dir, probe, 0.0 if status == "below_floor" else 0.9)
    run = read(result_dir, "--json")
    assert run.returncode == exitcodes.READ_STATUS[status], run.stdout + run.stderr
    (verdict,) = json.loads(run.stdout)
    assert verdict["evidence"]["stop_at_cap"] == (16 if status == "below_floor" else 0)


def test_flagged_loops_that_end_as_a_stop_at_the_budget_are_cut_off_in_every_word(result_dir: Path) -> None:
    # A reasoning model loops in its reasoning; its server ends it at the budget as a stop, with no
    # answer. The evidence files it cut off (reasoning); the reader and the summary say the same.
    from probe.summary import _healthy

    probe, requests = _probe()
    for request in requests[:6]:
        while not request.flagged:
            probe.partial(request, 0, LOOP)
        message = {"role": "assistant", "content": "", "reasoning_content": LOOP * 200}
        probe.observe(request, {"choices": [{"index": 0, "finish_reason": "stop", "message": message}],
                                "usage": {"completion_tokens": 4096}})  # fmt: skip
    document = probe.evidence_document()
    task = document["tasks"]["t"]
    assert (task["cut_off"], task["causes"][contract.REASONING], task["false_flags"]) == (6, 6, 0)
    assert "6 of 6 generations observed were cut off (6 of them flagged as looping first)" in _healthy([document])
    _write_results(result_dir, probe, 0.0)
    text = read(result_dir, "--task", "t").stdout
    assert "stopped by themselves" not in text
    assert "6 of the stops were at the budget's end" in text


@pytest.mark.parametrize("reason", ["content_filter", "eos_token"])
def test_flagged_generations_that_end_below_the_budget_are_not_cut_off_in_the_summary(
    result_dir: Path, reason: str
) -> None:
    from probe.summary import _healthy

    probe, requests = _probe()
    for request in requests[:2]:
        while not request.flagged:
            probe.partial(request, 0, LOOP)
        probe.observe(request, {"choices": [{"index": 0, "finish_reason": reason, "text": "42"}],
                                "usage": {"completion_tokens": 300}})  # fmt: skip
    document = probe.evidence_document()
    assert document["tasks"]["t"]["cut_off"] == 0
    assert "0 of 2 generations observed were cut off" in _healthy([document])


def test_a_groups_figures_carry_its_tasks_stops_at_the_cap() -> None:
    from probe.reader.evidence import summed

    total = summed([figures(stop_at_cap=3, cut_off=3, causes={"output_cap": 3}), figures()])
    assert total is not None and total["stop_at_cap"] == 3


def test_the_words_count_each_flagged_ending_as_the_evidence_filed_it(result_dir: Path) -> None:
    # Flags the model proved wrong, flags that ended below the budget for another reason, and
    # cut-off generations that were never flagged: only the evidence's own counts tell them apart.
    from probe.summary import _healthy

    def ended(request: object, reason: str, tokens: int, text: str = "42") -> None:
        probe.observe(request, {"choices": [{"index": 0, "finish_reason": reason, "text": text}],
                                "usage": {"completion_tokens": tokens}})  # fmt: skip

    probe, requests = _probe()
    for request, reason in zip(requests[:4], ["content_filter", "content_filter", "stop", "stop"], strict=True):
        while not request.flagged:
            probe.partial(request, 0, LOOP)
        ended(request, reason, 300)
    ended(requests[4], "stop", 4096)  # never flagged: a server that hides the cap
    for request in requests[5:]:
        ended(request, "stop", 100)
    document = probe.evidence_document()
    task = document["tasks"]["t"]
    assert (task["cut_off"], task["false_flags"], task["flagged_cut_off"]) == (1, 2, 0)
    said = _healthy([document])
    assert "1 of 40 generations observed were cut off" in said and "flagged as looping first" not in said
    _write_results(result_dir, probe, 0.9)
    text = read(result_dir, "--task", "t").stdout
    assert "2 stopped by themselves" in text and "of the stops were at the budget's end" not in text
