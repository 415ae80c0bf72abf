"""The probe on real lm-eval model objects, talking HTTP to the simulated server."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from lm_eval.models import api_models
from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI
from support.lm import COMMON, GEN_KWARGS, chat, completions, generate, probe_installed, settled

from probe.demo.simserver import SimServer
from probe.runtime import install
from probe.runtime.api_models import api
from probe.runtime.core import contract
from probe.runtime.hooking import patching
from probe.runtime.scope import state


def _cancelled(probe: state.Probe) -> int:
    return sum(group.cancelled for group in probe.groups)


def _sidecar(result_dir: Path) -> dict:
    return json.loads((result_dir / contract.SIDECAR_NAME).read_text())


def test_trips_at_the_threshold_and_blanks_the_rest(sim, probed, result_dir) -> None:
    server = sim("never_stop")
    answers = generate(completions(server.base_url, num_concurrent=16), 40)
    assert len(answers) == 40
    real = [a for a in answers if a]
    assert len(real) == 16 and all(a.startswith(" and") for a in real)
    assert answers.count("") == 24
    # The 16 observed, plus any cancelled in flight at the trip (the server saw them start).
    assert server.snapshot()["generate_requests"] == 16 + _cancelled(probed)
    verdict = _sidecar(result_dir)["verdict"]
    assert (verdict["observations"], verdict["pathological"], verdict["pathology"]) == (16, 16, "non_terminating")
    assert verdict["finish_reasons"] == {"length": 16} and verdict["max_tokens"] == [2048]


def test_does_not_trip_below_min_samples(sim, probed, result_dir) -> None:
    server = sim("never_stop")
    answers = generate(completions(server.base_url), 15)
    assert all(a.startswith(" and") for a in answers)
    assert server.snapshot()["generate_requests"] == 15
    assert not (result_dir / contract.SIDECAR_NAME).exists()


def test_knobs_change_the_threshold(sim, result_dir, monkeypatch) -> None:
    monkeypatch.setenv(contract.ENV_MIN_SAMPLES, "4")
    server = sim("never_stop")
    with probe_installed():
        answers = generate(completions(server.base_url, num_concurrent=4), 12)
    assert answers.count("") == 8
    assert _sidecar(result_dir)["verdict"]["settings"][contract.ENV_MIN_SAMPLES] == 4


def test_short_budgets_are_not_evidence(sim, probed, result_dir) -> None:
    server = sim("never_stop")
    answers = generate(completions(server.base_url), 20, {**GEN_KWARGS, "max_tokens": 256})
    assert all(a.startswith(" and") for a in answers)
    assert list(probed.groups) and all(g.tally.observed == 0 for g in probed.groups)


def test_healthy_model_answers_exactly_as_unprobed(sim, result_dir) -> None:
    server = sim("healthy")
    unprobed = generate(completions(server.base_url), 40)
    with probe_installed():
        probed_answers = generate(completions(server.base_url), 40)
    assert probed_answers == unprobed == [f" {3 * i + 1}" for i in range(40)]
    assert not (result_dir / contract.SIDECAR_NAME).exists()


def test_repetition_counts_as_pathological(sim, probed, result_dir) -> None:
    server = sim("repetition")
    answers = generate(completions(server.base_url), 24)
    assert answers.count("") == 8
    verdict = _sidecar(result_dir)["verdict"]
    assert verdict["repetition"] == 16 and verdict["finish_reasons"] == {"repetition": 16}


def test_mixed_model_below_the_ratio_does_not_trip(sim, probed, result_dir) -> None:
    server = sim("mixed", cap_fraction=0.3)
    answers = generate(completions(server.base_url), 40)
    assert "" not in answers
    assert server.snapshot()["generate_requests"] == 40


def test_gate_survives_a_fresh_event_loop(sim, probed, result_dir) -> None:
    """lm-eval calls asyncio.run() per batch: the gate must not be bound to an old loop."""
    server = sim("healthy")
    lm = completions(server.base_url, num_concurrent=4)
    first = generate(lm, 12)
    second = generate(lm, 12, {**GEN_KWARGS, "until": ["Question:"]})
    assert first == second and len(probed.gates) <= 2
    assert server.snapshot()["generate_requests"] == 24


def test_a_trip_ends_only_its_own_group(sim, probed, result_dir) -> None:
    never = sim("never_stop")
    lm = completions(never.base_url, num_concurrent=16)
    assert generate(lm, 32).count("") == 16
    # Another group (other stop sequences) gathers its own evidence before it trips.
    assert generate(lm, 32, {**GEN_KWARGS, "until": ["Question:"]}).count("") == 16
    final_groups = [g for g in probed.groups if g.tripped]
    assert len(final_groups) == 2
    probed.finalise()
    sidecar = _sidecar(result_dir)
    assert sidecar["verdict"]["group"]["until"] == ["\n\n"]  # the first trip's verdict stands
    assert [g["gen_kwargs"]["until"] for g in sidecar["final"]["short_circuited_groups"]] == [["\n\n"], ["Question:"]]
    assert sidecar["final"]["short_circuited_requests"] == 32


def foreign_sidecar(run_id: str, tripped_at: float) -> dict:
    """A trip record another process wrote: valid by the one definition (trip_record_problem),
    which the runtime and the reader share, so a bare {tripped_at, pid, run_id} is not one."""
    return {"schema_version": 1, "verdict": {
        "tripped": True, "pathology": "non_terminating", "observations": 16, "pathological": 16,
        "finish_reasons": {"length": 16}, "max_tokens": [64], "settings": {}, "tripped_at": tripped_at,
        "pid": 1, "run_id": run_id}, "final": None}  # fmt: skip


@pytest.mark.parametrize("offset", [-3600, +3600])  # an earlier run's, or one stamped in the future
def test_another_runs_sidecar_is_moved_aside_never_overwritten(sim, probed, result_dir, offset) -> None:
    result_dir.mkdir(parents=True)
    other = foreign_sidecar("f" * 32 + ".1", time.time() + offset)
    (result_dir / contract.SIDECAR_NAME).write_text(json.dumps(other))
    older = result_dir / f"{contract.SIDECAR_NAME}.stale-{int(other['verdict']['tripped_at'])}"
    older.write_text("an older stale record")  # must survive
    server = sim("never_stop")
    assert generate(completions(server.base_url, num_concurrent=16), 20).count("") == 4
    assert _sidecar(result_dir)["verdict"]["run_id"] == probed.run_id
    moved = sorted(result_dir.glob(f"{contract.SIDECAR_NAME}.stale-*"))
    assert len(moved) == 2 and older.read_text() == "an older stale record"
    assert [json.loads(m.read_text()) for m in moved if m != older] == [other]


def test_a_sidecar_of_this_run_from_another_process_is_followed(sim, probed, result_dir, capsys) -> None:
    result_dir.mkdir(parents=True)
    mine = foreign_sidecar(probed.run_id, time.time())
    (result_dir / contract.SIDECAR_NAME).write_text(json.dumps(mine))
    server = sim("never_stop")
    assert generate(completions(server.base_url, num_concurrent=16), 20).count("") == 4
    assert json.loads((result_dir / contract.SIDECAR_NAME).read_text()) == mine
    assert "sidecar written by process 1 of this run" in capsys.readouterr().err


def make_dangling_link(path: Path) -> None:
    path.symlink_to(path.parent / "nowhere")


def make_loop(path: Path) -> None:
    path.symlink_to(path)


def make_link_out(path: Path) -> None:
    outside = path.parent.parent / "outside.json"
    outside.write_text(json.dumps(foreign_sidecar("e" * 32 + ".1", time.time())))
    path.symlink_to(outside)


def make_corrupt(path: Path) -> None:
    path.write_text('{"schema_version": 1, "verdict": {"tripped')


def make_directory(path: Path) -> None:
    path.mkdir()


def make_fifo(path: Path) -> None:
    os.mkfifo(path)


@pytest.mark.parametrize(
    "plant", [make_dangling_link, make_loop, make_link_out, make_corrupt, make_directory, make_fifo]
)
def test_something_else_at_the_sidecar_path_cuts_nothing_short(sim, probed, result_dir, capsys, plant) -> None:
    result_dir.mkdir(parents=True)
    path = result_dir / contract.SIDECAR_NAME
    plant(path)
    before = sorted(p.name for p in result_dir.parent.rglob("*"))
    server = sim("never_stop")
    answers = generate(completions(server.base_url, num_concurrent=16), 40)
    assert "" not in answers and server.snapshot()["generate_requests"] == 40
    err = capsys.readouterr().err
    assert err.count("TRIP NOT APPLIED") == 1 and "already written by another process" not in err
    assert sorted(p.name for p in result_dir.parent.rglob("*")) == before  # nothing written, moved or followed


def test_sync_path_trips_too(sim, probed, result_dir) -> None:
    server = sim("never_stop")
    answers = generate(completions(server.base_url, num_concurrent=1), 24)
    assert answers.count("") == 8
    assert server.snapshot()["generate_requests"] == 16


def test_batched_completions_count_every_choice(sim, probed, result_dir) -> None:
    server = sim("never_stop")
    answers = generate(completions(server.base_url, num_concurrent=1, batch_size=4), 32)
    assert answers.count("") == 16  # 4 requests x 4 prompts observed, then the rest blank
    assert server.snapshot()["generate_requests"] == 4
    assert _sidecar(result_dir)["verdict"]["observations"] == 16


def test_chat_behind_a_replaced_static_parser(sim, result_dir) -> None:
    """InferenceX replaces LocalChatCompletion.parse_generations before the probe installs."""
    original = LocalChatCompletion.__dict__["parse_generations"]

    def pipeline_parser(outputs, **kwargs):
        outputs = outputs if isinstance(outputs, list) else [outputs]
        return [(c.get("message") or {}).get("content") or "" for out in outputs for c in out["choices"]]

    LocalChatCompletion.parse_generations = staticmethod(pipeline_parser)
    server = sim("never_stop")
    assert install.install()
    try:
        answers = generate(chat(server.base_url, num_concurrent=1), 24, chat_format=True)
        assert isinstance(LocalChatCompletion.__dict__["parse_generations"], staticmethod)
    finally:
        install.uninstall()
        assert LocalChatCompletion.__dict__["parse_generations"].__func__ is pipeline_parser
        LocalChatCompletion.parse_generations = original
    assert answers.count("") == 8 and server.snapshot()["generate_requests"] == 16


def test_after_the_trip_no_generate_request_reaches_the_server_and_in_flight_ones_are_cancelled(
    sim, result_dir, monkeypatch
) -> None:
    monkeypatch.setenv(contract.ENV_MIN_SAMPLES, "2")
    # A whole wave in flight, as without the slow start: under it a never-stopping model
    # has nothing in flight at the trip (see test_slow_start_*).
    monkeypatch.setenv(contract.ENV_SLOW_START, "off")
    server = sim("never_stop", seconds_per_token=0.0002, jitter=2.0)  # 0.4 s to 1.2 s each
    assert install.install()
    started = time.monotonic()
    try:
        answers = generate(completions(server.base_url, num_concurrent=8), 40)
        state.ACTIVE.finalise()
    finally:
        install.uninstall()
    elapsed = time.monotonic() - started
    # The server counts a request the probe cancelled when it notices the closed connection.
    stats = settled(server)
    sidecar = _sidecar(result_dir)
    tripped_at = sidecar["verdict"]["tripped_at"]
    assert [t for t in stats["generate_request_times"] if t > tripped_at] == []
    # The rule judges the sample (the first 2 sent): until both end (1.2 s at most), each of the
    # other 6 places can turn over at most 3 times (0.4 s at least a generation).
    assert stats["generate_requests"] == stats["completed"] + stats["aborted"] <= 8 + 6 * 3
    # Every request the server saw aborted was cancelled by the probe; the probe may also
    # cancel a request whose connection had not yet reached the server.
    assert 1 <= stats["aborted"] <= sidecar["final"]["cancelled_in_flight"]
    # The server may finish a request in the instant the probe cancels it: then the answer
    # is blank although the server counted it complete.
    real = [a for a in answers if a]
    assert 2 <= len(real) <= stats["completed"] and all(a.startswith(" and") for a in real)
    assert elapsed < 30  # sanity bound only: the cancelled requests were not waited out


def test_slow_start_a_never_stopping_model_reaches_the_server_min_samples_times(sim, probed, result_dir) -> None:
    server = sim("never_stop", seconds_per_token=0.0001)  # 0.2 s per generation
    answers = generate(completions(server.base_url, num_concurrent=64), 100)
    stats = server.snapshot()
    assert stats["generate_requests"] == 16 and stats["aborted"] == 0
    real = [a for a in answers if a]
    assert len(real) == 16 and all(a.startswith(" and") for a in real) and answers.count("") == 84
    probed.finalise()
    sidecar = _sidecar(result_dir)
    assert (sidecar["verdict"]["observations"], sidecar["final"]["cancelled_in_flight"]) == (16, 0)
    assert sidecar["verdict"]["settings"][contract.ENV_SLOW_START] == "auto"


def test_slow_start_widens_as_a_healthy_model_stops_and_no_answer_changes(sim, result_dir) -> None:
    server = sim("healthy", seconds_per_token=0.001, lengths="lognormal")  # about 0.3 s per answer
    unprobed = generate(completions(server.base_url, num_concurrent=64), 200)
    before = server.snapshot()
    assert install.install()
    try:
        probed_answers = generate(completions(server.base_url, num_concurrent=64), 200)
    finally:
        install.uninstall()
    assert probed_answers == unprobed == [f" {3 * i + 1}" for i in range(200)]
    stats = server.snapshot()
    start = before["generate_requests"]
    arrivals = list(zip(stats["in_flight_at_arrival"][start:], stats["stopped_at_arrival"][start:], strict=True))
    assert len(arrivals) == 200
    # 16 requests before any answer stopped, then the whole width: all 64 in flight, as unprobed.
    for sent, (_, stopped) in enumerate(arrivals, start=1):
        assert sent <= 16 or stopped > before["stopped"], (sent, stopped - before["stopped"])
    assert max(in_flight for in_flight, _ in arrivals) == 64
    assert max(before["in_flight_at_arrival"]) == 64


@pytest.mark.parametrize("reason", ["timeout", "content_filter", "model_length", "canceled"])
def test_an_early_error_from_a_model_that_never_stops_opens_the_slow_start_by_a_share(sim, result_dir, reason) -> None:
    # An error says nothing of the model: it lets 2 x 64 / 16 more through, not a whole wave.
    server = sim("never_stop", first_n=1, first_reason=reason, seconds_per_token=0.0002)
    assert install.install()
    try:
        answers = generate(completions(server.base_url, num_concurrent=64), 200)
    finally:
        install.uninstall()
    assert "" in answers
    assert server.snapshot()["generate_requests"] <= 16 + 8


class _NamesTheCap(SimServer):
    """A server that names the budget's end as it likes (``finish_reason`` of its own)."""

    name = "length"

    def _plan(self, prompt: str, max_tokens: int, turned: bool = False) -> tuple[str, int, str]:
        text, tokens, reason = super()._plan(prompt, max_tokens, turned)
        return text, tokens, (self.name if reason == "length" else reason)


@pytest.mark.parametrize("name", ["max_tokens", "model_length", "eos_token", "MAX_TOKENS"])
def test_a_model_that_never_stops_trips_whatever_its_server_calls_the_cap(result_dir, name) -> None:
    server = _NamesTheCap("never_stop", seconds_per_token=0.00005)
    server.name = name
    server.start()
    try:
        with probe_installed():
            answers = generate(completions(server.base_url, num_concurrent=64), 120)
        assert answers.count("") == 120 - 16 and server.snapshot()["generate_requests"] == 16
    finally:
        server.stop()


@pytest.mark.parametrize(("mode", "concurrency"), [("off", 32), ("auto", 128)])
def test_without_the_slow_start_a_whole_wave_is_sent(sim, result_dir, monkeypatch, mode, concurrency) -> None:
    monkeypatch.setenv(contract.ENV_SLOW_START, mode)
    server = sim("never_stop", seconds_per_token=0.001)  # 2 s per generation: the wave is all sent first
    assert install.install()
    try:
        answers = generate(completions(server.base_url, num_concurrent=concurrency), concurrency + 8)
    finally:
        install.uninstall()
    # The whole first wave reached the server (and places freed by the first answers at the
    # cap let a few more in before the 16th arrived).
    assert server.snapshot()["generate_requests"] >= concurrency
    assert "" in answers and len([a for a in answers if a]) >= 16


def test_loglikelihood_is_never_short_circuited(sim, probed, result_dir) -> None:
    server = sim("never_stop")
    lm = completions(server.base_url, num_concurrent=16)
    assert generate(lm, 20).count("") == 4
    tokens = [[1, 2, 3, 4], [5, 6, 7]]
    lm.tokenized_requests = True  # loglikelihood requests travel as token ids
    results = asyncio.run(
        lm.get_batched_requests(tokens, cache_keys=[("a", "b"), ("c", "d")], generate=False, ctxlens=[2, 1])
    )
    assert [r for batch in results for r in batch] == [(-1.0, True), (-1.0, True)]
    assert server.snapshot()["loglikelihood_requests"] == 2


def test_disable_switch_patches_nothing(sim, result_dir, monkeypatch) -> None:
    monkeypatch.setenv(contract.ENV_SWITCH, "off")
    before = api_models.TemplateAPI.__dict__["amodel_call"]
    assert install.install() is False
    assert api_models.TemplateAPI.__dict__["amodel_call"] is before
    server = sim("never_stop")
    assert all(generate(completions(server.base_url), 24))
    assert server.snapshot()["generate_requests"] == 24


def test_install_twice_patches_once_and_uninstall_restores(result_dir) -> None:
    originals = {n: api_models.TemplateAPI.__dict__[n] for n in ("amodel_call", "model_call")}
    assert install.install() and install.install()
    try:
        for name, original in originals.items():
            assert api_models.TemplateAPI.__dict__[name].__wrapped__ is original
    finally:
        install.uninstall()
    for name, original in originals.items():
        assert api_models.TemplateAPI.__dict__[name] is original


def test_unwritable_result_dir_means_no_short_circuit(sim, tmp_path, monkeypatch, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("RESULT_DIR", str(blocker / "results"))
    server = sim("never_stop")
    with probe_installed():
        answers = generate(completions(server.base_url), 30)
    assert all(answers) and server.snapshot()["generate_requests"] == 30
    assert "TRIP NOT APPLIED" in capsys.readouterr().err


def test_malformed_responses_are_not_evidence(sim, probed, result_dir, capsys) -> None:
    bad = {"choices": [{"index": 0, "text": " 1", "finish_reason": 42}], "usage": {"completion_tokens": "many"}}
    server = sim("malformed", malformed_body=bad)
    answers = generate(completions(server.base_url), 20)
    assert answers == [" 1"] * 20
    assert all(g.tally.observed == 0 for g in probed.groups)
    assert capsys.readouterr().err.count("a response held no generation the probe can read") == 1


def test_an_internal_error_is_contained_and_reported_once(sim, probed, result_dir, monkeypatch, capsys) -> None:
    def broken(*args):
        raise RuntimeError("probe bug")

    monkeypatch.setattr(state, "describe_choices", broken)
    server = sim("healthy")
    assert generate(completions(server.base_url), 20) == [f" {3 * i + 1}" for i in range(20)]
    err = capsys.readouterr().err
    assert err.count("internal error in observe") == 1 and "probe bug" in err


def test_short_circuit_answers_never_reach_the_cache_hook(sim, probed, result_dir, tmp_path) -> None:
    from lm_eval.api.model import CachingLM

    server = sim("never_stop")
    lm = completions(server.base_url, num_concurrent=16)
    cached = CachingLM(lm, str(tmp_path / "cache.db"))
    answers = generate(cached, 40)
    stored = list(cached.dbdict._inner.values())
    assert answers.count("") == 24
    assert len(stored) == 16 and all(s.startswith(" and") for s in stored)


@pytest.mark.parametrize("cls", [LocalCompletionsAPI, LocalChatCompletion])
def test_parser_hook_keeps_the_method_kind(cls, probed) -> None:
    raw_before = cls.__dict__.get("parse_generations")
    api.observe_parser(cls)
    raw_after = cls.__dict__.get("parse_generations")
    assert type(raw_after) is type(raw_before)
    assert patching.is_ours(raw_after)


def test_an_untested_lm_eval_is_warned_about_once_and_still_probed(result_dir, monkeypatch, capsys) -> None:
    monkeypatch.setattr(install, "installed_version", lambda tested: "0.9.0")
    try:
        assert install.install() and install.install()
        assert patching.is_ours(api_models.TemplateAPI.__dict__["amodel_call"])
    finally:
        install.uninstall()
    assert capsys.readouterr().err.count("lm-eval 0.9.0 is outside what this probe was tested with") == 1


class _CallableParser:
    """A pipeline's parser that is a callable object rather than a function."""

    def __call__(self, outputs, **kwargs):
        outputs = outputs if isinstance(outputs, list) else [outputs]
        return [c.get("text") or "" for out in outputs for c in out["choices"]]


def _classmethod_parser(cls, outputs, **kwargs):
    outputs = outputs if isinstance(outputs, list) else [outputs]
    return [c.get("text") or "" for out in outputs for c in out["choices"]]


@pytest.mark.parametrize("kind", [classmethod(_classmethod_parser), _CallableParser()], ids=["classmethod", "object"])
@pytest.mark.parametrize("concurrency", [1, 8])
def test_every_kind_of_replaced_parser_is_observed_and_its_blanks_stay_typed(
    sim, result_dir, tmp_path, kind, concurrency
) -> None:
    from lm_eval.api.model import CachingLM

    original = LocalCompletionsAPI.__dict__["parse_generations"]
    LocalCompletionsAPI.parse_generations = kind
    server = sim("never_stop")
    assert install.install()
    try:
        cached = CachingLM(completions(server.base_url, num_concurrent=concurrency), str(tmp_path / "cache.db"))
        answers = generate(cached, 40)
        stored = list(cached.dbdict._inner.values())
    finally:
        install.uninstall()
        assert LocalCompletionsAPI.__dict__["parse_generations"] is kind
        LocalCompletionsAPI.parse_generations = original
    assert answers.count("") == 24 and (result_dir / contract.SIDECAR_NAME).exists()
    assert len(stored) == 16 and "" not in stored  # no blank reaches the cache to be replayed


def test_a_parser_that_cannot_be_wrapped_is_said_once_and_runs_unprobed(sim, result_dir, capsys) -> None:
    class Descriptor:
        def __get__(self, instance, owner):
            return lambda outputs, **kwargs: [c["text"] for c in outputs["choices"]]

    original = LocalCompletionsAPI.__dict__["parse_generations"]
    LocalCompletionsAPI.parse_generations = Descriptor()
    server = sim("never_stop")
    assert install.install()
    try:
        answers = generate(completions(server.base_url, num_concurrent=1), 30)
    finally:
        install.uninstall()
        LocalCompletionsAPI.parse_generations = original
    assert "" not in answers and server.snapshot()["generate_requests"] == 30
    assert capsys.readouterr().err.count("cannot be observed") == 1


@pytest.mark.parametrize("calls_ours", [False, True], ids=["parses-itself", "calls-ours"])
def test_a_subclass_parser_made_with_wraps_around_the_probes_is_observed_once(sim, result_dir, calls_ours) -> None:
    """A pipeline's subclass whose parser carries the probe's (functools.wraps) but parses by itself
    was taken for the probe's and never observed on the async path; one that calls the probe's
    is observed once, not twice."""
    import functools

    server = sim("never_stop")
    assert install.install()
    try:
        generate(completions(server.base_url, num_concurrent=1), 1)  # the probe wraps lm-eval's parser
        ours = LocalCompletionsAPI.__dict__["parse_generations"].__func__

        @functools.wraps(ours)
        def parse(outputs: Any, **kwargs: Any) -> list[str]:
            if calls_ours:
                return ours(outputs, **kwargs)
            return [c.get("text") or "" for out in (outputs if isinstance(outputs, list) else [outputs])
                    for c in out["choices"]]  # fmt: skip

        mine = type("Mine", (LocalCompletionsAPI,), {"parse_generations": staticmethod(parse)})
        url = f"{server.base_url}/v1/completions"
        answers = generate(mine(base_url=url, num_concurrent=4, **COMMON), 40, {**GEN_KWARGS, "max_tokens": 4096})
        probe = state.ACTIVE
    finally:
        install.uninstall()
    assert answers.count("") >= 40 - 16 - 4 and (result_dir / contract.SIDECAR_NAME).exists()
    (group,) = [g for g in probe.groups if g.tally.observed > 1]
    assert group.tally.observed == 40 - answers.count("")  # each answer that came back observed once


@pytest.mark.parametrize("batch_size", [1, 2])
def test_sglang_generates_native_answers_are_judged(sim, result_dir, batch_size) -> None:
    """lm-eval's sglang-generate talks to SGLang's /generate, whose answers hold each output's
    finish reason in its meta_info (a list of outputs for a batch): read, a never-stopping model
    trips as on the OpenAI routes, and a healthy one is answered as unprobed."""
    from lm_eval.api.registry import get_model

    try:
        sglang = get_model("sglang-generate")  # as lm-eval's command line finds it
    except ValueError as error:  # InferenceX's lm-eval: its lazy entry names a class its module does not define
        pytest.skip(f"this lm-eval cannot load its own sglang-generate model ({error})")

    def model(server: Any) -> Any:
        return sglang(base_url=f"{server.base_url}/generate", num_concurrent=4, batch_size=batch_size, **COMMON)

    healthy = sim("healthy")
    unprobed = generate(model(healthy), 24)
    never = sim("never_stop")
    with probe_installed():
        probed = generate(model(healthy), 24)
        answers = generate(model(never), 40, {**GEN_KWARGS, "max_tokens": 4096})  # a group of its own
        probe = state.ACTIVE
    assert probed == unprobed and "" not in probed
    assert answers.count("") >= 40 - 16 - 4 * batch_size and (result_dir / contract.SIDECAR_NAME).exists()
    verdict = _sidecar(result_dir)["verdict"]
    assert (verdict["pathological"], verdict["max_tokens"], verdict["finish_reasons"]) == (16, [4096], {"length": 16})
    assert sum(group.tally.observed for group in probe.groups) >= 24 + 16
