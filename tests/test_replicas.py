"""The exchange between lm-eval's process and its data-parallel vLLM replicas (``replicas``,
``replica_engine``), on real files in a real directory, without vLLM: what the replicas
report reaches the one ``Probe`` exactly as if it had watched every engine itself, a trip
reaches every replica, and the tags never change what vLLM is asked.

The end-to-end runs on real vLLM replicas (Ray) are in ``test_vllm_replicas.py``.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from probe.runtime.core import contract
from probe.runtime.scope import state
from probe.runtime.scope.groups import Request
from probe.runtime.scope.log import forget_said
from probe.runtime.vllm.replica_engine import Replica, _replica_generate, share
from probe.runtime.vllm.replicas import TAG, Exchange, _say_unreached

# Imports no lm-eval: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

MAX_TOKENS = 1024
GEN_KWARGS = [{"until": ["\n\n"], "max_gen_toks": MAX_TOKENS}, {"until": ["Q:"], "max_gen_toks": MAX_TOKENS}]


@dataclass
class Sampling:
    """What the exchange reads and writes of vLLM's ``SamplingParams``: a plain value with
    ``extra_args`` (vLLM's own class is a msgspec struct with the same field)."""

    max_tokens: int
    extra_args: dict[str, Any] | None = None


def response(reason: str) -> dict[str, Any]:
    """A response as the replica reports it: at the cap when cut off, else one token."""
    tokens = MAX_TOKENS if reason == "length" else 1
    return {"choices": [{"index": 0, "finish_reason": reason, "text": "a"}], "usage": {"completion_tokens": tokens}}


def plan(probe: state.Probe, groups: list[int], tasks: list[str]) -> list[Request]:
    return [
        probe.request(None, GEN_KWARGS[g], [None], MAX_TOKENS, backend="vllm", tasks=[t])
        for g, t in zip(groups, tasks, strict=True)
    ]


@pytest.fixture(autouse=True)
def result_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RESULT_DIR", str(tmp_path))
    forget_said()  # each test hears the lines said once per process
    return tmp_path


calls = st.integers(1, 40).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 1), min_size=n, max_size=n),  # each prompt's group
        st.lists(st.sampled_from(["stop", "length"]), min_size=n, max_size=n),  # how it ended
        st.lists(st.integers(0, 3), min_size=n, max_size=n),  # the replica it went to
        st.randoms(use_true_random=False),  # the order the replicas finish in
    )
)


@pytest.fixture(scope="module")
def restored_environ() -> Any:
    """os.environ as it was once the module's tests are done (hypothesis's examples set RESULT_DIR
    each, and a function-scoped monkeypatch would outlive none of them)."""
    with mock.patch.dict(os.environ):
        yield


@settings(max_examples=30, deadline=None)
@given(call=calls)
def test_what_the_replicas_report_is_what_one_engine_would_have_shown(tmp_path_factory, restored_environ, call) -> None:
    groups, reasons, replica_of, order = call
    tasks = [f"task{g}" for g in groups]
    directory = str(tmp_path_factory.mktemp("exchange"))
    os.environ["RESULT_DIR"] = str(tmp_path_factory.mktemp("result"))
    settings_ = contract.Settings(min_samples=4)
    merged, alone = state.Probe(settings_, evaluation=True), state.Probe(settings_, evaluation=True)
    exchange = Exchange(merged, plan(merged, groups, tasks), directory)
    tagged = exchange.tagged([Sampling(MAX_TOKENS) for _ in groups])
    shares: dict[int, list[int]] = {}
    for i, r in enumerate(replica_of):
        shares.setdefault(r, []).append(i)
    replicas = {}
    for r, places in shares.items():
        _, got, numbers, _, _ = share([tagged[i] for i in places])
        assert got == places
        replicas[r] = Replica(directory, got, numbers)
    events = [(r, j) for r, places in shares.items() for j in range(len(places))]
    order.shuffle(events)
    for r, j in events:  # the replicas finish in any order; the driver reads as they go
        replica = replicas[r]
        replica.observe(replica.requests[j], response(reasons[shares[r][j]]))
        exchange.drain()
    for replica in replicas.values():
        replica.close()
    expected = plan(alone, groups, tasks)
    for r, j in events:
        alone.observe(expected[shares[r][j]], response(reasons[shares[r][j]]))
    assert exchange.reported == set(range(len(groups)))
    # The same evidence per task and per group, trip included, as one engine's.
    assert merged.evidence_document()["tasks"] == alone.evidence_document()["tasks"]
    assert [g.tally.as_dict() for g in merged.groups] == [g.tally.as_dict() for g in alone.groups]
    assert [g.tripped for g in merged.groups] == [g.tripped for g in alone.groups]


def test_a_trip_reaches_every_replica_and_their_blanks_are_counted(result_dir: Path) -> None:
    probe = state.Probe(contract.Settings(min_samples=4), evaluation=True)
    exchange = Exchange(probe, plan(probe, [0] * 8 + [1] * 2, ["a"] * 8 + ["b"] * 2), str(result_dir / "x"))
    os.mkdir(exchange.directory)
    tagged = exchange.tagged([Sampling(MAX_TOKENS) for _ in range(10)])
    first, second = (Replica(exchange.directory, *share(tagged[k::2])[1:3]) for k in (0, 1))
    for j in range(2):  # four cut off in all: two from each replica trip group 0, not group 1
        first.observe(first.requests[j], response("length"))
        second.observe(second.requests[j], response("length"))
    assert second.newly_tripped() == []  # nothing tripped yet
    exchange.drain()
    assert [g.tripped for g in probe.groups] == [True, False]
    sidecar = json.loads((result_dir / contract.SIDECAR_NAME).read_text())
    assert sidecar["verdict"]["run_id"] == probe.run_id and sidecar["verdict"]["pid"] == os.getpid()
    second.next_look = first.next_look = 0.0
    tripped = second.newly_tripped()
    assert [g.key for g in tripped] == ["0"] and first.newly_tripped()[0].key == "0"
    assert second.newly_tripped() == []  # told once
    for replica in (first, second):  # each aborts its unfinished requests of group 0: blank
        for request in replica.requests[2:4]:
            assert replica.blanks(request, cancelled=True) == [""]
        replica.observe(replica.requests[4], response("stop"))  # group 1 carries on
        replica.close()
    exchange.drain()
    evidence = probe.evidence_document()["tasks"]
    assert evidence["a"]["cancelled_in_flight"] == evidence["a"]["short_circuited"] == 4
    assert evidence["b"]["short_circuited"] == 0 and evidence["b"]["observations"] == 2
    assert exchange.blanked == {4, 5, 6, 7}
    assert sorted(os.listdir(exchange.directory)).count("tripped-0") == 1


def test_a_line_still_being_written_is_read_once_it_is_whole(result_dir: Path) -> None:
    probe = state.Probe(contract.Settings(), evaluation=True)
    exchange = Exchange(probe, plan(probe, [0], ["a"]), str(result_dir))
    line = json.dumps({"i": 0, "response": response("stop")}) + "\n"
    path = result_dir / "replica-1.jsonl"
    path.write_text(line[:20])
    exchange.drain()
    assert exchange.reported == set()
    path.write_text(line)
    exchange.drain()
    exchange.drain()
    assert exchange.reported == {0} and probe.evidence_document()["tasks"]["a"]["observations"] == 1


def test_a_line_naming_no_request_of_the_call_is_ignored_with_one_line(result_dir: Path, capsys) -> None:
    probe = state.Probe(contract.Settings(), evaluation=True)
    exchange = Exchange(probe, plan(probe, [0], ["a"]), str(result_dir))
    lines = [{"i": 7, "response": response("length")}, {"i": "0"}, {"i": 0, "response": response("stop")}, {"i": 0}]
    (result_dir / "replica-1.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    exchange.drain()
    assert exchange.reported == {0}
    assert probe.evidence_document()["tasks"]["a"]["finish_reasons"] == {"stop": 1}  # counted once
    assert capsys.readouterr().err.count("a replica's line names no request of this call left to report") == 1


def test_prompts_no_replica_reported_are_said_once_never_counted(result_dir: Path, capsys) -> None:
    probe = state.Probe(contract.Settings(), evaluation=True)
    exchange = Exchange(probe, plan(probe, [0, 0, 0], ["a"] * 3), str(result_dir))
    (result_dir / "replica-1.jsonl").write_text(json.dumps({"i": 1, "response": response("length")}) + "\n")
    exchange.drain()
    _say_unreached(exchange)
    _say_unreached(exchange)
    err = capsys.readouterr().err
    assert err.count("2 of 3 prompts went to vLLM replicas that did not load the probe (1 replica(s) reported)") == 1
    assert probe.evidence_document()["tasks"]["a"]["observations"] == 1


extra_args = st.none() | st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3)


@given(originals=st.lists(extra_args.map(lambda e: Sampling(MAX_TOKENS, e)), min_size=1, max_size=6))
def test_vllm_is_asked_exactly_what_lm_eval_asked(tmp_path_factory, originals) -> None:
    probe = state.Probe(contract.Settings(), evaluation=True)
    before = copy.deepcopy(originals)
    exchange = Exchange(probe, plan(probe, [0] * len(originals), ["a"] * len(originals)), "/nowhere")
    tagged = exchange.tagged(originals)
    assert originals == before  # lm-eval's own objects untouched
    directory, places, numbers, untagged, watch = share(tagged)
    assert (directory, places, numbers) == ("/nowhere", list(range(len(originals))), [0] * len(originals))
    # The driver's loop detector (on by default) asks each replica for partial outputs.
    assert watch is exchange.probe.settings.detector is True
    # The engine gets the driver's settings; an empty extra_args is vLLM's default, None.
    assert untagged == [Sampling(MAX_TOKENS, o.extra_args or None) for o in originals]


def test_a_call_the_driver_did_not_tag_passes_through(capsys) -> None:
    assert share([Sampling(1), Sampling(2, {"user": 1})]) is None
    assert share(Sampling(1)) is None and share(None) is None and share([]) is None
    assert capsys.readouterr().err == ""
    # Half tagged cannot be told apart: unprobed, said once.
    assert share([Sampling(1, {TAG: {"dir": "/d", "i": 0, "g": 0}}), Sampling(1)]) is None
    assert "only some of its prompts tagged" in capsys.readouterr().err


def test_a_replica_that_cannot_reach_the_exchange_directory_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Replica(str(tmp_path / "on-another-machine"), [0], [0])


def ran_with(llm: Any, prompts: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
    """Stands for vLLM's LLM.generate: what it was called with."""
    return params


def test_tags_it_cannot_read_leave_the_call_as_it_is_and_never_raise(capsys) -> None:
    generate = _replica_generate(ran_with)
    for tag in ({"dir": "/d", "i": "0", "g": 0}, {"dir": 1, "i": 0, "g": 0}, {"i": 0}):
        params = [Sampling(1, {TAG: tag})]
        assert generate(None, ["p"], params) is params
    assert capsys.readouterr().err.count("only some of its prompts tagged") == 1  # said once


def test_a_replica_on_another_machine_runs_its_share_unprobed_with_the_tags_off(tmp_path: Path, capsys) -> None:
    tag = {"dir": str(tmp_path / "not-here"), "i": 0, "g": 0}
    params = _replica_generate(ran_with)(None, ["p"], [Sampling(1, {TAG: tag, "user": 2})])
    assert params == [Sampling(1, {"user": 2})]
    assert "cannot reach its run's exchange directory" in capsys.readouterr().err
    assert not (tmp_path / "not-here").exists()


def test_partial_output_from_a_replica_reaches_the_loop_detector_and_its_trip_every_replica(result_dir: Path) -> None:
    probe = state.Probe(contract.Settings(min_samples=1), evaluation=True)
    exchange = Exchange(probe, plan(probe, [0, 0], ["a", "a"]), str(result_dir / "x"))
    os.mkdir(exchange.directory)
    tagged = exchange.tagged([Sampling(MAX_TOKENS)] * 2)
    looping, other = (Replica(exchange.directory, *share(tagged[k::2])[1:3]) for k in (0, 1))
    for _ in range(100):  # a loop, handed over piece by piece as the engine produces it
        looping.partial(looping.requests[0], 0, "the cat sat on the mat ")
    exchange.drain()
    assert exchange.reported == set()  # still running: only partial output so far
    (group,) = probe.groups
    assert group.tripped and group.tally.as_dict()["causes"]["repetition"] == 1
    assert [g.key for g in other.newly_tripped()] == ["0"]  # the other replica is told
    looping.observe(looping.requests[0], response("length"))  # how the flagged request ended
    exchange.drain()
    assert exchange.reported == {0} and group.tally.as_dict()["observations"] == 1  # counted once
    for replica in (looping, other):
        replica.close()


def test_a_line_that_is_not_json_loses_no_other_line_of_the_read(result_dir: Path, capsys) -> None:
    # A short write (a full disk) leaves a line cut off, and the next line joins it.
    probe = state.Probe(contract.Settings(), evaluation=True)
    exchange = Exchange(probe, plan(probe, [0, 0, 0], ["a"] * 3), str(result_dir))
    good = [json.dumps({"i": i, "response": response("stop")}) for i in (0, 2)]
    (result_dir / "replica-1.jsonl").write_text(f'{good[0]}\n{{"i": 1, "resp{good[1]}\n')
    (result_dir / "replica-2.jsonl").write_text(json.dumps({"i": 1, "response": response("stop")}) + "\n")
    exchange.drain()
    assert exchange.reported == {0, 1}  # the whole lines around it, and the other replica's
    assert probe.evidence_document()["tasks"]["a"]["observations"] == 2
    assert capsys.readouterr().err.count("is not a whole JSON line") == 1


def test_a_replica_that_cannot_write_its_report_never_fails_its_generation(tmp_path: Path, capsys) -> None:
    replica = Replica(str(tmp_path), [0, 1], [0, 0])
    os.close(replica.fd)  # as a full disk or a vanished directory would make every write fail
    replica.fd = os.open(os.devnull, os.O_RDONLY)
    replica.observe(replica.requests[0], response("stop"))
    replica.partial(replica.requests[1], 0, "more")
    assert replica.blanks(replica.requests[1], cancelled=True) == [""]
    replica.close()
    assert capsys.readouterr().err.count("cannot write to its run's exchange directory") == 1


def test_a_blank_whose_report_never_arrived_is_still_counted_as_the_probes(result_dir: Path) -> None:
    from probe.runtime.vllm.replicas import generate_across
    from probe.runtime.vllm.vllm_offline import BlankOutput

    probe = state.Probe(contract.Settings(), evaluation=True)
    requests = plan(probe, [0, 0], ["a", "a"])
    real = type("Output", (), {"request_id": "1", "outputs": []})()
    outputs, blanked = generate_across(
        probe, requests, [Sampling(MAX_TOKENS)] * 2, lambda tagged: [BlankOutput("0"), real], ray=False
    )
    assert blanked == {0} and outputs[1] is real
    assert probe.evidence_document()["tasks"]["a"]["short_circuited"] == 1


@dataclass
class Completion:
    """A ``CompletionOutput`` in cumulative mode: the whole text and token ids so far."""

    text: str
    token_ids: list[int]
    index: int = 0


@dataclass
class Running:
    request_id: str
    outputs: list[Completion]
    finished: bool = False


def test_partial_output_is_read_every_stream_interval_tokens_not_every_token(tmp_path: Path) -> None:
    # vLLM ignores stream_interval in cumulative mode (it reports every step): the probe paces itself.
    from probe.runtime.vllm.replica_engine import ReplicaCall
    from probe.runtime.vllm.vllm_partial import STREAM_INTERVAL

    replica = Replica(str(tmp_path), [0], [0])
    call = ReplicaCall(replica, None, replica.requests, ids=["0"], watch=True)  # type: ignore[arg-type]
    replica.newly_tripped = list  # type: ignore[method-assign]  # no marker here
    tokens = 4 * STREAM_INTERVAL + 3
    for n in range(1, tokens + 1):
        call.after_step([Running("0", [Completion("ab" * n, list(range(n)))])])
    replica.close()
    (name,) = os.listdir(tmp_path)
    lines = [json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
    assert len(lines) == 4  # one read per STREAM_INTERVAL tokens
    assert "".join(line["text"] for line in lines) == "ab" * 4 * STREAM_INTERVAL  # nothing lost between reads


def test_no_usable_temporary_directory_runs_the_replicas_unprobed_never_fails_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import tempfile

    from probe.runtime.vllm.replicas import generate_across

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))  # removed by a cleaner, or never writable
    probe = state.Probe(contract.Settings(), evaluation=True)
    params = [Sampling(MAX_TOKENS), Sampling(MAX_TOKENS, {"user": 1})]
    asked: list[Any] = []
    outputs, blanked = generate_across(
        probe, plan(probe, [0, 0], ["a", "a"]), params, lambda given: asked.append(given) or ["x", "y"], ray=False
    )
    assert (outputs, blanked) == (["x", "y"], set()) and asked == [params]  # as lm-eval asked: no tags
    assert "internal error in vllm replicas" in capsys.readouterr().err


def test_ray_workers_get_the_drivers_pythonpath_as_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker does not start in the driver's directory (a `ray start` cluster never does): a
    # relative entry would name nothing there, and the replicas would run unprobed.
    import sys
    import types

    from probe.runtime.vllm.replicas import _join_ray

    joined: list[dict[str, Any]] = []
    ray = types.SimpleNamespace(is_initialized=lambda: False, init=lambda **kwargs: joined.append(kwargs))
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"site{os.pathsep}/abs/other")
    _join_ray()
    (kwargs,) = joined
    assert kwargs["runtime_env"]["env_vars"]["PYTHONPATH"] == f"{tmp_path / 'site'}:/abs/other:${{PYTHONPATH}}"


def test_a_replica_file_that_cannot_be_read_loses_no_other_replicas_report(result_dir: Path, capsys) -> None:
    probe = state.Probe(contract.Settings(), evaluation=True)
    exchange = Exchange(probe, plan(probe, [0], ["a"]), str(result_dir))
    (result_dir / "replica-0.jsonl").mkdir()  # sorted first: unreadable as a file
    (result_dir / "replica-1.jsonl").write_text(json.dumps({"i": 0, "response": response("stop")}) + "\n")
    exchange.drain()
    exchange.drain()
    assert exchange.reported == {0}
    assert capsys.readouterr().err.count("cannot read a replica's report") == 1
