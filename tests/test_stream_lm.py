"""Streamed evidence on lm-eval's async path, against the simulated server: the answers are
those of unprobed runs, what cannot be streamed falls back to one ordinary request, the knob
decides, and a trip closes the streams in flight so that the server stops generating."""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.lm import GEN_KWARGS, chat, completions, generate, probe_installed, settled
from support.resultfiles import written_by_lm_eval

from probe.demo.localtask import offline_env, task_name
from probe.runtime import install
from probe.runtime.core import contract
from probe.runtime.core.contract import ENV_STREAM
from probe.runtime.scope import state


def _responses(output: Path) -> list[list]:
    (samples,) = written_by_lm_eval(output, f"samples_{task_name()}_*.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    return [row["resps"] for row in sorted(rows, key=lambda r: (r["doc_id"], r.get("filter", "")))]


def _lm_eval(site: Path | None, server, task, output: Path, endpoint: str, batch: int) -> list[list]:
    command = task.lm_eval_command(
        server.base_url, "sim", output, 16384, 8, "--log_samples", "--batch_size", str(batch)
    )
    if endpoint == "chat":
        at = command.index("local-completions")
        command[at] = "local-chat-completions"
        command[at + 2] = command[at + 2].replace("/v1/completions", "/v1/chat/completions")
        command.append("--apply_chat_template")
    # Every request streamed (under auto, only those sent while the verdict is open).
    env = offline_env(site, RESULT_DIR=str(output), **{ENV_STREAM: "on"})
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "could not be reassembled" not in run.stderr
    return _responses(output)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("endpoint", "options", "batch"),
    [
        ("completions", {"lengths": "lognormal"}, 4),  # several prompts per request: choices by index
        # Reasoning deltas first, then the answer (the other field name: the test below).
        ("chat", {"lengths": "reasoning", "reasoning_field": "reasoning_content"}, 1),
    ],
)
def test_probed_streamed_and_unprobed_runs_log_the_same_responses(
    sim, site_dir, local_task, tmp_path, endpoint, options, batch
) -> None:
    server = sim("healthy", **options)
    plain = _lm_eval(None, server, local_task, tmp_path / "plain", endpoint, batch)
    assert server.snapshot()["streamed"] == 0
    probed = _lm_eval(site_dir, server, local_task, tmp_path / "probed", endpoint, batch)
    stats = server.snapshot()
    assert stats["streamed"] == stats["generate_requests"] / 2 > 0  # every probed request streamed
    assert probed == plain and len(plain) == 40


@pytest.mark.parametrize(
    ("mode", "quirk"),
    [("healthy", None), ("empty", None), ("reasoning", None), ("reasoning", "unlabelled"), ("empty", "unlabelled")],
)
def test_streamed_chat_answers_are_the_unprobed_ones_empty_or_null_too(
    sim, result_dir, monkeypatch, capsys, mode, quirk
) -> None:
    # "empty": content "" (vLLM's empty answer without a reasoning parser); "reasoning": null
    # after the thinking (vLLM's, at the cap), or "" from a server that does not say it is vLLM
    # ("unlabelled"), which the stream cannot tell apart: that falls back. lm-eval 0.4.12+
    # turns null content into its placeholder (older releases hand on None, and b315ef3 logs
    # it as "" but caches nothing): set to a text here, so that null and "" differ.
    from lm_eval.models import api_models

    monkeypatch.setattr(api_models, "LMEVAL_MODEL_NONE_ANSWER_PLACEHOLDER", "NONE", raising=False)
    server = sim(mode, lengths="reasoning", reasoning_field="reasoning", stream_quirk=quirk)
    plain = generate(chat(server.base_url, num_concurrent=2), 6, chat_format=True)
    before = server.snapshot()["generate_requests"]
    with probe_installed():
        probed = generate(chat(server.base_url, num_concurrent=2), 6, chat_format=True)
    stats = server.snapshot()
    assert probed == plain
    content = _unstreamed_content(server.base_url)
    assert content == {"healthy": content or "?", "empty": "", "reasoning": "" if quirk else None}[mode]
    fallbacks = stats["generate_requests"] - before - 6
    said = capsys.readouterr().err.count("an empty answer, which this server may send as null")
    if mode == "empty" and quirk is None:
        # vLLM's empty answer without reasoning: "" without a reasoning parser, null with some.
        # The answer is uncertain, not the stream: each falls back, and streaming goes on until
        # the sample's verdict is final (4 of the 6 stopped: the rest could not trip it).
        assert 4 <= stats["streamed"] == fallbacks <= 6 and said == 1
    elif quirk is None:
        assert stats["streamed"] == 6 and fallbacks == 0 and said == 0
    else:  # auto: the two in flight at the first fall back, then no more streaming
        assert stats["streamed"] == fallbacks == 2 and said == 1


def _unstreamed_content(base_url: str) -> str | None:
    """The content of the server's own unstreamed chat answer (what the case is about)."""
    payload = {"model": "sim", "messages": [{"role": "user", "content": "Q"}], "max_tokens": 2048}
    post = urllib.request.Request(f"{base_url}/v1/chat/completions", json.dumps(payload).encode(), method="POST")
    post.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(post, timeout=10) as reply:
        return json.load(reply)["choices"][0]["message"]["content"]


# deep_event: json.loads raised RecursionError, which escaped the fallback (hostile round 19).
QUIRKS = ["refuse", "no_usage", "error_event", "unknown_field", "json", "deep_event"]


@pytest.mark.parametrize("quirk", QUIRKS)
@pytest.mark.parametrize("knob", ["auto", "on"])
def test_what_cannot_be_streamed_falls_back_to_one_ordinary_request_or_none(
    sim, result_dir, monkeypatch, capsys, quirk, knob
) -> None:
    monkeypatch.setenv(ENV_STREAM, knob)
    server = sim("healthy", stream_quirk=quirk)
    plain = generate(completions(server.base_url, num_concurrent=2, batch_size=2), 12)
    before = server.snapshot()
    with probe_installed():
        probed = generate(completions(server.base_url, num_concurrent=2, batch_size=2), 12)
    stats = server.snapshot()
    assert probed == plain
    attempts = stats["generate_requests"] - before["generate_requests"] - 6  # beyond one per request
    said = capsys.readouterr().err
    if quirk == "json":
        # The server ignored stream and sent the whole answer: it is used, nothing is sent twice.
        assert attempts == 0 and said.count("answered a streamed request unstreamed") == 1
        return
    if knob == "on":
        assert attempts == (0 if quirk == "refuse" else 6)  # a refusal is answered before generating
    else:
        # auto: the server is not streamed again after its first fallback (two were in flight).
        assert attempts <= (0 if quirk == "refuse" else 2)
    assert said.count("could not be reassembled") == 1


@pytest.mark.parametrize("knob", ["auto", "on"])
@pytest.mark.parametrize("case", ["rambling", "reasoning", "short"])
def test_a_gateway_that_streams_the_text_so_far_changes_no_answer_and_flags_nothing(
    sim, result_dir, monkeypatch, capsys, knob, case
) -> None:
    # Each chunk carries its text so far, not what is new, and the last the whole answer again.
    # Joined, every answer was all its prefixes in a row (13 times too long), which the loop
    # detector took for a loop: a healthy run tripped and its answers changed (hostile rounds 19
    # and 20). Long texts that never loop, 300 rambling tokens (a rule that cannot fire) or a
    # thinking model's 3,000 tokens of reasoning, are refused as a way of streaming; a short
    # answer (its text, then the same again) is only uncertain: it falls back, the next streams.
    monkeypatch.setenv(ENV_STREAM, knob)
    monkeypatch.setenv(contract.ENV_MIN_SAMPLES, "100000")
    monkeypatch.setenv(contract.ENV_MIN_MAX_TOKENS, "0")  # every request is evidence, so streamed
    chat_format = case == "reasoning"
    server, gen_kwargs = {
        "rambling": (sim("never_stop", stream_quirk="so_far"), {**GEN_KWARGS, "max_tokens": 300}),
        "reasoning": (sim("healthy", lengths="reasoning", stream_quirk="so_far"), GEN_KWARGS),
        "short": (sim("healthy", stream_quirk="so_far"), GEN_KWARGS),
    }[case]

    def lm() -> Any:
        return chat(server.base_url, 2) if chat_format else completions(server.base_url, num_concurrent=2)

    plain = generate(lm(), 12, gen_kwargs, chat_format)
    before = server.snapshot()["generate_requests"]
    with probe_installed() as probe:
        probed = generate(lm(), 12, gen_kwargs, chat_format)
        probe.finalise()
        (group,) = probe.evidence_document()["groups"]
    attempts = server.snapshot()["generate_requests"] - before - 12
    assert probed == plain and group["flagged"] == 0 and group["observations"] == 12
    said = capsys.readouterr().err
    if case == "short":
        # Streamed until the sample's verdict was final (8 of the 12 stopped), then plainly.
        assert 8 <= attempts <= 12 and said.count("extends or repeats the one before") == 1
        return
    # Refused as a way of streaming: under auto the server is streamed no more (two were in flight).
    assert attempts == 12 if knob == "on" else attempts <= 2
    assert said.count("the server streams the text so far") == 1


def test_a_defect_of_the_reassembly_falls_back_instead_of_failing_the_request(
    sim, result_dir, monkeypatch, capsys
) -> None:
    # A failure nobody foresaw (here a TypeError, standing for a defect of the probe's own) is a
    # refusal: the ordinary request answers, where it would have escaped into lm-eval's retries.
    from probe.runtime.core.stream import Reassembly

    def defect(self: Reassembly, data: str) -> list:
        raise TypeError("a defect")

    server = sim("healthy")
    plain = generate(completions(server.base_url, num_concurrent=2), 6)
    monkeypatch.setattr(Reassembly, "add_event", defect)
    with probe_installed():
        probed = generate(completions(server.base_url, num_concurrent=2), 6)
    assert probed == plain
    assert capsys.readouterr().err.count("could not be reassembled (the reassembly failed (TypeError: a defect))") == 1


def test_a_server_busy_once_is_streamed_again(sim, result_dir, capsys) -> None:
    # An HTTP 500 to a streamed request says the server was busy, not that it cannot stream:
    # that request goes unstreamed, and the next ones stream again.
    server = sim("healthy", stream_quirk="busy_once")
    plain = generate(completions(server.base_url, num_concurrent=4), 12)
    with probe_installed():
        probed = generate(completions(server.base_url, num_concurrent=4), 12)
    said = capsys.readouterr().err
    # Streamed again until the sample's verdict was final (8 of the 12 stopped; the one answered
    # 500, sent again unstreamed, may be among those 8).
    assert probed == plain and 7 <= server.snapshot()["streamed"] <= 11
    assert said.count("could not be reassembled (status 500); sent it unstreamed, each request tries again") == 1


def test_a_looping_model_behind_a_server_busy_once_is_streamed_and_flagged(sim, result_dir) -> None:
    # Its first streamed request answered 500 (and then, unstreamed, at once), the server was
    # taken for one that cannot stream: nothing more was streamed to it in the process, and a
    # looping model was caught only as its loops reached the cap.
    server = sim("loop_short", stream_quirk="busy_once", seconds_per_token=0.0005)
    with probe_installed() as probe:
        generate(completions(server.base_url, num_concurrent=8), 400, {**GEN_KWARGS, "max_tokens": 4096})
        probe.finalise()
        (group,) = probe.evidence_document()["groups"]
    assert group["tripped"] and group["flagged"] >= 12
    # Only the request answered 500, then sent unstreamed, ran to the cap: the sample waited for it.
    assert group["finish_reasons"].get("length", 0) <= 1
    assert server.snapshot()["streamed"] >= 15  # the sample, less the request that fell back


BROKE = "a stream that broke off or stalled: ClientPayloadError"


@pytest.mark.parametrize(
    ("quirk", "said", "under_auto"),
    [
        # Each of the two in flight falls back, and the server is not streamed again.
        ("held_open", "a stream held open after its choices ended, without [DONE]", (2, 2)),
        ("stall_mid", "a stream that broke off or stalled: TimeoutError", (2, 2)),
        # A stream begun after one broke off breaks off too: then the server is not streamed
        # again (2 to 4 streamed: the sim answers at once, so a stream may begin before or after
        # the one beside it broke off).
        ("drop_mid", BROKE, (2, 4)),
        ("drop_after_last", BROKE, (2, 4)),
        # One stream cut, as a restart cuts those in flight: the rest stream again, until the
        # sample's verdict is final (4 of the 6 stopped).
        ("drop_once", BROKE, (4, 6)),
    ],
)
@pytest.mark.parametrize(("knob", "n"), [("auto", 6), ("on", 2)])
def test_a_stream_held_open_stalled_or_cut_short_falls_back_to_one_ordinary_request(
    sim, result_dir, monkeypatch, capsys, quirk, said, under_auto, knob, n
) -> None:
    # Unprobed, lm-eval got its answers at once: ordinary requests to this server work, its
    # streams (or a proxy's) do not. Held open (every choice ended, then neither the usage nor
    # [DONE]) or stalled after the first text, a stream ends at lm-eval's timeout; cut short, at
    # once. Either way the request goes unstreamed.
    monkeypatch.setenv(ENV_STREAM, knob)
    server = sim("healthy", stream_quirk=quirk)
    plain = generate(completions(server.base_url, num_concurrent=2, timeout=2), n)
    with probe_installed():
        probed = generate(completions(server.base_url, num_concurrent=2, timeout=2), n)
    stats = server.snapshot()
    streamed, fallbacks = stats["streamed"], stats["generate_requests"] - 2 * n
    least, most = under_auto if knob == "auto" else (n, n)
    assert probed == plain and least <= streamed <= most
    assert fallbacks == (1 if quirk == "drop_once" else streamed)  # each stream that failed, sent once more
    assert capsys.readouterr().err.count(said) == 1


def test_an_answer_sent_as_one_event_past_aiohttps_line_limit_is_reassembled(sim, result_dir, monkeypatch) -> None:
    # A buffering gateway sends each choice's whole text as one event: 650 KB here, past the
    # 512 KiB that aiohttp reads as one line. Unprobed, lm-eval reads it as one JSON body.
    monkeypatch.setenv(contract.ENV_MIN_SAMPLES, "100")  # no trip: the answers are compared
    server = sim("never_stop", stream_quirk="one_event")
    gen_kwargs = {**GEN_KWARGS, "max_tokens": 120_000}
    plain = generate(completions(server.base_url, num_concurrent=2), 4, gen_kwargs)
    with probe_installed():
        probed = generate(completions(server.base_url, num_concurrent=2), 4, gen_kwargs)
    assert probed == plain and min(len(answer) for answer in plain) > 600_000
    stats = server.snapshot()
    assert stats["streamed"] == 4 and stats["generate_requests"] == 8  # reassembled: no fallback


@pytest.mark.parametrize("knob", ["auto", "on"])
def test_a_reply_cut_short_while_read_fails_as_unstreamed_and_is_sent_once(sim, result_dir, monkeypatch, knob) -> None:
    # A JSON reply whose connection drops while its body is read: before, the probe took that
    # for "not an answer" and sent the request again at once, each of lm-eval's retries twice.
    monkeypatch.setenv(ENV_STREAM, knob)
    server = sim("healthy", stream_quirk="json_cut")
    outcomes = {}
    for arm in ("plain", "probed"):
        before = server.snapshot()["generate_requests"]
        with probe_installed() if arm == "probed" else contextlib.nullcontext():
            try:
                outcomes[arm] = ("answers", generate(completions(server.base_url, num_concurrent=2), 1))
            except Exception as error:  # lm-eval gives up after its retries
                outcomes[arm] = ("error", type(error).__name__)
        outcomes[arm] += (server.snapshot()["generate_requests"] - before,)
    # One request (more would race each other's retries): each of lm-eval's attempts sent once.
    assert outcomes["probed"] == outcomes["plain"]
    assert outcomes["plain"][2] > 1  # lm-eval retried: the reply was an error to it


def test_with_the_knob_off_nothing_is_streamed(sim, result_dir, monkeypatch) -> None:
    monkeypatch.setenv(ENV_STREAM, "off")
    server = sim("healthy")
    with probe_installed():
        generate(completions(server.base_url, num_concurrent=4), 8)
    assert server.snapshot()["streamed"] == 0 and server.snapshot()["generate_requests"] == 8


def test_a_trip_closes_the_streams_in_flight_and_the_server_stops_generating(sim, result_dir, monkeypatch) -> None:
    monkeypatch.setenv(contract.ENV_MIN_SAMPLES, "2")
    monkeypatch.setenv(contract.ENV_SLOW_START, "off")  # a whole wave in flight at the trip
    server = sim("loop_short", seconds_per_token=0.0005, jitter=2.0)  # 1 s to 3 s each
    assert install.install()
    try:
        answers = generate(completions(server.base_url, num_concurrent=8), 40)
        state.ACTIVE.finalise()
    finally:
        install.uninstall()
    stats = settled(server)
    sidecar = json.loads((result_dir / contract.SIDECAR_NAME).read_text())
    # Only the sample (the first 2 sent) is streamed; the wave beside it is cancelled at the trip.
    assert stats["streamed"] == 2 and stats["generate_requests"] == 8
    # Nothing is generating any more, and each request the probe closed was aborted there.
    assert stats["in_flight"] == 0
    assert stats["aborted"] == stats["generate_requests"] <= sidecar["final"]["cancelled_in_flight"]
    assert stats["tokens_generated"] < stats["generate_requests"] * 2048
    # The loop detector sees the cycle as it streams: the trip comes before any generation
    # ends, and every request in flight is closed mid-generation.
    assert sidecar["verdict"]["cause"] == contract.REPETITION
    assert sum(1 for a in answers if a) == stats["completed"] == 0


def _never_stopping_run(sim, result_dir, mode: str) -> tuple[dict, dict]:
    # 4 s for a generation of 4,096 tokens: the detector flags within the first few hundred, and the
    # trip ends the rest; at 0.8 s a saturated machine let a generation end before its flag was read.
    server = sim(mode, seconds_per_token=0.001)
    with probe_installed() as probe:
        generate(completions(server.base_url, num_concurrent=16), 40, {**GEN_KWARGS, "max_tokens": 4096})
        probe.finalise()
    return settled(server), json.loads((result_dir / contract.SIDECAR_NAME).read_text())


@pytest.mark.parametrize("mode", ["loop_short", "loop_paragraph", "loop_near"])
def test_a_looping_model_trips_on_repetition_before_any_generation_reaches_the_cap(sim, result_dir, mode) -> None:
    stats, sidecar = _never_stopping_run(sim, result_dir, mode)
    assert sidecar["verdict"]["cause"] == contract.REPETITION
    assert sidecar["verdict"]["flagged"] == sidecar["verdict"]["pathological"] == 16
    assert stats["completed"] == 0  # no generation ran to its end: each was closed mid-stream
    assert stats["aborted"] == stats["generate_requests"] == 16
    assert stats["tokens_generated"] < 16 * 4096 / 2


def test_random_text_never_loops_and_trips_by_the_cap_rule(sim, result_dir) -> None:
    stats, sidecar = _never_stopping_run(sim, result_dir, "random")
    assert sidecar["verdict"]["cause"] == contract.OUTPUT_CAP
    assert sidecar["verdict"]["flagged"] == 0
    assert stats["completed"] == stats["generate_requests"] == 16


def test_a_flagged_attempt_that_times_out_is_not_counted_again_by_its_retry(sim, result_dir, monkeypatch) -> None:
    # Each attempt is flagged within its first tokens, then lm-eval's timeout ends its stream,
    # the ordinary request sent in its place times out too, and tenacity retries it: a new call
    # for the same prompts, streamed again (the knob on), whose flag must not count twice.
    monkeypatch.setenv(contract.ENV_MIN_SAMPLES, "8")
    monkeypatch.setenv(contract.ENV_SLOW_START, "off")
    monkeypatch.setenv(ENV_STREAM, "on")
    server = sim("loop_short", seconds_per_token=0.005)  # 20 s for 4,096 tokens
    lm = completions(server.base_url, num_concurrent=4, timeout=2)
    lm.max_retries = 3
    with probe_installed() as probe:
        with pytest.raises(Exception):  # noqa: B017 - the retries run out: lm-eval's own error
            generate(lm, 4, {**GEN_KWARGS, "max_tokens": 4096})
        probe.finalise()
    # Four generations were seen looping: four observations, not one per attempt.
    assert not (result_dir / contract.SIDECAR_NAME).exists()
    stats = server.snapshot()
    assert stats["streamed"] == 4 * 3 and stats["generate_requests"] == 4 * 3 * 2


@pytest.mark.parametrize(
    ("knobs", "gen_kwargs"),
    [
        ({contract.ENV_DETECTOR: "off"}, GEN_KWARGS),  # nothing would read the text
        ({}, {**GEN_KWARGS, "max_tokens": 256}),  # below MIN_MAX_TOKENS: not evidence, never analysed
    ],
)
def test_requests_whose_text_nothing_reads_are_not_streamed(sim, result_dir, monkeypatch, knobs, gen_kwargs) -> None:
    for name, value in knobs.items():
        monkeypatch.setenv(name, value)
    server = sim("healthy")
    with probe_installed():
        generate(completions(server.base_url, num_concurrent=4), 8, gen_kwargs)
    assert server.snapshot()["streamed"] == 0 and server.snapshot()["generate_requests"] == 8


def test_a_flag_under_a_budget_never_read_does_not_count(sim, result_dir, monkeypatch, capsys) -> None:
    """A builder swapped in (calling lm-eval's own, lowering the budget to 512) while requests wait
    at the gate: theirs is never read, so their streamed loops are flagged for no rule (the
    prediction, 2048, once counted them and tripped a run whose requests went out at 512)."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    monkeypatch.setenv(ENV_STREAM, "on")
    monkeypatch.setattr(LocalCompletionsAPI, "_create_payload", LocalCompletionsAPI._create_payload)
    plain = LocalCompletionsAPI._create_payload

    def first(self: Any, *args: Any, **kwargs: Any) -> dict:
        LocalCompletionsAPI._create_payload = lambda me, *a, **k: {**plain(me, *a, **k), "max_tokens": 512}
        return plain(self, *args, **kwargs)

    LocalCompletionsAPI._create_payload = first
    server = sim("loop_short", seconds_per_token=0.0002)
    with probe_installed() as probe:
        answers = generate(completions(server.base_url, num_concurrent=8), 40, {**GEN_KWARGS, "max_tokens": 2048})
        figures = probe.evidence_document()["unattributed"]  # lm-eval's requests, no task of theirs
    assert "" not in answers and not (result_dir / contract.SIDECAR_NAME).exists()
    assert figures["unknown_budget"] > 0 and figures["flagged"] == 0 and figures["cut_off"] == 40
    assert capsys.readouterr().err.count("payload was built by no payload builder the probe reads") == 1
