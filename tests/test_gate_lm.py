"""The gate against real lm-eval and the simulated server: a probed run never stalls, and the
rule judges a uniform sample of a group's requests, not lm-eval's longest-first order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from lm_eval.api.instance import Instance
from support.lm import GEN_KWARGS, completions, probe_installed

from probe.demo.simserver import SimServer, healthy_answer
from probe.runtime.core.sampling import Sampling
from probe.runtime.inprocess.order import sample_members
from probe.runtime.scope import state


def _finishes(run: Callable[[], Any], timeout: float = 90) -> tuple[str, Any]:
    """("ok", value) or ("error", exception type) of ``run``, failing if it is still running
    after ``timeout`` seconds (a stalled run must fail the test, not hang it)."""
    outcome: list[tuple[str, Any]] = []

    def target() -> None:
        try:
            outcome.append(("ok", run()))
        except Exception as error:
            outcome.append(("error", type(error)))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"the run stalled: still running after {timeout} s"
    return outcome[0]


def _generate(lm: Any, texts: list[str]) -> list[str]:
    requests = [
        Instance(request_type="generate_until", doc={}, arguments=(text, dict(GEN_KWARGS)), idx=i)
        for i, text in enumerate(texts)
    ]
    return lm.generate_until(requests)


def _questions(n: int) -> list[str]:
    """Arithmetic questions, each longer than the one before (lm-eval sends the last first)."""
    return [f"Question{' .' * i}: What is {i} + {2 * i + 1}?\nAnswer:" for i in range(n)]


@pytest.mark.parametrize(
    "reason", ["error", "timeout", "abort", "cancelled", "content_filter", "made_up_reason", "no_choices", "malformed"]
)
@pytest.mark.parametrize("concurrency", [8, 1])
def test_a_server_whose_first_answers_are_neither_stops_nor_caps_never_stalls_the_run(
    sim, result_dir, reason: str, concurrency: int
) -> None:
    """The first 16 requests the server sees (MIN_SAMPLES) end with ``reason``: the probed run
    ends as the unprobed one does, with the same error, or with the same answers but for which
    prompts got the server's empty ones (the probe sends them in another order)."""
    texts = _questions(24)

    def run(probed: bool) -> tuple[str, Any]:
        server = sim("healthy", first_n=16, first_reason=reason)
        lm = completions(server.base_url, num_concurrent=concurrency)
        if not probed:
            return _finishes(lambda: _generate(lm, texts))
        with probe_installed():
            return _finishes(lambda: _generate(lm, texts))

    probed, unprobed = run(probed=True), run(probed=False)
    assert probed[0] == unprobed[0]
    if probed[0] == "error":
        assert probed == unprobed
        return
    assert sum(a == "" for a in probed[1]) == sum(a == "" for a in unprobed[1])
    for answers in (probed[1], unprobed[1]):
        assert len(answers) == len(texts)
        assert all(a in ("", healthy_answer(t)) for a, t in zip(answers, texts, strict=True))


def _correlated(sim: Any, texts: list[str], cap_share: float) -> Any:
    """A server that runs the longest ``cap_share`` of ``texts`` to the cap, and stops on the rest."""
    threshold = sorted(len(t) for t in texts)[int(len(texts) * (1 - cap_share))]
    return sim("mixed", cap_min_chars=threshold)


@pytest.mark.parametrize("concurrency", [8, 1])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_model_whose_caps_are_all_on_the_longest_prompts_is_judged_on_a_uniform_sample(
    sim, result_dir, concurrency: int, seed: int
) -> None:
    """20% of the answers at the cap, all on the longest prompts, which lm-eval sends first.
    Judged in lm-eval's order, the first 16 observations are all at the cap and the run trips
    (score 0 where the truth is 0.8); judged on a uniform sample it trips with probability
    below 1e-4 (bench_rule's table), and the answers are exactly the unprobed ones."""
    texts = _questions(80)
    server = _correlated(sim, texts, 0.2)
    assert sum(server.at_cap(t) for t in texts) == 16
    unprobed = _generate(completions(server.base_url, num_concurrent=concurrency), texts)
    with probe_installed() as probe:
        probe.sampling = Sampling(seed)
        probed = _generate(completions(server.base_url, num_concurrent=concurrency), texts)
        document = probe.evidence_document()
    assert probed == unprobed
    assert document["tripped"] is False and document["groups"][0]["observations"] == 80
    assert document["sampling"]["seed"] == seed and document["sampling"]["method"] == "seeded-sample-first"
    assert not (result_dir / "hyperloom_eval_probe.json").exists()


def test_a_never_stopping_model_still_trips_after_min_samples_in_the_sampled_order(sim, result_dir) -> None:
    server = sim("never_stop")
    with probe_installed():
        answers = _generate(completions(server.base_url, num_concurrent=8), _questions(60))
        assert state.ACTIVE is not None and next(iter(state.ACTIVE.groups)).tripped
    assert server.snapshot()["generate_requests"] == 16 and sum(a == "" for a in answers) == 44


class _RecordingServer(SimServer):
    """A simulated server that keeps which prompts each generate request carried."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requests: list[list[str]] = []

    async def _completions(self, request: Any) -> Any:
        payload = await request.json()
        if payload.get("max_tokens"):
            prompt = payload.get("prompt")
            self.requests.append(list(prompt) if isinstance(prompt, list) else [prompt])
        return await super()._completions(request)


@pytest.mark.parametrize("concurrency", [8, 1])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_several_prompts_per_request_are_a_random_set_not_a_block_of_lm_evals_longest_first_order(
    sim, result_dir, concurrency: int, seed: int
) -> None:
    """batch_size 8: in lm-eval's order each request holds 8 prompts of neighbouring length, so the
    first 16 observations are two blocks (the two longest blocks hold every answer at the cap: trip
    probability about 1/45, not the table's 3.35e-06). The sample goes first, 8 random prompts a
    request; the rest keep lm-eval's order, two blocks included, and are not judged."""
    texts = _questions(80)
    threshold = sorted(len(t) for t in texts)[int(len(texts) * 0.8)]
    with _RecordingServer("mixed", cap_min_chars=threshold) as server:
        unprobed = _generate(completions(server.base_url, num_concurrent=concurrency, batch_size=8), texts)
        assert sum(all(server.at_cap(prompt) for prompt in sent) for sent in server.requests) == 2  # two blocks
        server.requests.clear()
        with probe_installed() as probe:
            probe.sampling = Sampling(seed)
            probed = _generate(completions(server.base_url, num_concurrent=concurrency, batch_size=8), texts)
            document = probe.evidence_document()
    assert probed == unprobed and document["tripped"] is False
    assert len(server.requests) == 10
    sample = sample_members(seed, [(text, GEN_KWARGS) for text in texts], probe.reserve)
    judged = [sent for sent in server.requests if any(texts.index(prompt) in sample for prompt in sent)]
    assert len(judged) == 8 and not any(all(server.at_cap(prompt) for prompt in sent) for sent in judged)


def test_a_collator_a_pipeline_puts_in_after_the_probe_installed_sorts_in_the_sampled_order_too(
    sim, result_dir
) -> None:
    """The probe patched ``Collator`` at install; a pipeline that then puts its own in its
    place (as parse_generations may be replaced later) would give the rule lm-eval's order
    again: the 16 longest prompts first, all at the cap, and a healthy run blanked. The probe
    patches it again at each generate_until, and uninstall leaves the pipeline's in place."""
    import lm_eval.models.api_models as api_models
    from lm_eval.models.utils import Collator

    texts = _questions(80)
    server = _correlated(sim, texts, 0.2)
    unprobed = _generate(completions(server.base_url, num_concurrent=1), texts)

    class PipelineCollator(Collator):
        pass

    with probe_installed() as probe:
        api_models.Collator = PipelineCollator
        try:
            probed = _generate(completions(server.base_url, num_concurrent=1), texts)
            document = probe.evidence_document()
        finally:
            from probe.runtime import install

            install.uninstall()
            kept = api_models.Collator
            api_models.Collator = Collator
    assert document["tripped"] is False and probed == unprobed
    assert kept is PipelineCollator


def test_repeats_of_one_prompt_that_runs_to_the_cap_do_not_trip_the_sync_path(sim, result_dir) -> None:
    """20 prompts, each sampled 16 times (lm-eval's ``repeats``); the copies of the one the
    sampled order puts first all run to the cap (5% of the answers). Sent together, those 16
    copies alone were the first 16 observations: a trip, and 304 healthy answers blanked."""
    from probe.runtime.core.sampling import rank

    texts = [f"Question {i}: What is {i} + {2 * i + 1}?\nAnswer:" for i in range(20)]
    first = min(texts, key=lambda text: rank(0, repr(text)))
    server = sim("healthy", loop_marker=first.split(":")[0] + ":")
    requests = [
        Instance(request_type="generate_until", doc={}, arguments=(text, dict(GEN_KWARGS)), idx=0, repeats=16)
        for text in texts
    ]
    repeated = [request for request in requests for _ in range(16)]
    unprobed = completions(server.base_url, num_concurrent=1).generate_until(repeated)
    with probe_installed() as probe:
        probed = completions(server.base_url, num_concurrent=1).generate_until(repeated)
        document = probe.evidence_document()
    assert document["tripped"] is False and probed == unprobed


def test_an_internal_error_where_a_call_ends_opens_the_gate_and_never_stalls_the_run(
    sim, result_dir, monkeypatch, capsys
) -> None:
    # A defect of the probe's own (it cannot be caused for real): reading where a group stands fails.
    def broken(self: Any, group: Any) -> bool:
        raise TypeError("a defect")

    texts = _questions(48)
    lm = completions(sim("healthy").base_url, num_concurrent=8)
    monkeypatch.setenv("HYPERLOOM_EVAL_PROBE_SLOW_START", "on")
    with probe_installed():
        monkeypatch.setattr(state.Probe, "settled", broken)
        outcome, answers = _finishes(lambda: _generate(lm, texts), timeout=60)
    assert outcome == "ok" and answers == [healthy_answer(t) for t in texts]
    assert "internal error in gate" in capsys.readouterr().err
