"""lm-eval's Collator in the sampled order: a seeded shuffle of each group, answers in place."""

from __future__ import annotations

import random
from typing import Any

import pytest
from lm_eval.models.utils import Collator

from probe.runtime.inprocess.order import batch_order, sampled_collator, sampled_order

SAMPLED = sampled_collator(Collator)
KWARGS = {"max_tokens": 2048}


def _requests(n: int) -> list[tuple[str, dict]]:
    return [(f"prompt {'.' * i}", KWARGS) for i in range(n)]


def _sent(requests: list, seed: int | None) -> tuple[list, list]:
    """(what lm-eval's sync loop would send, in order; the answers put back by get_original)."""
    with sampled_order(seed):
        collator = SAMPLED(requests, sort_fn=lambda r: -len(r[0]), group_by="gen_kwargs")
    sent = [request for batch in collator.get_batched(n=1) for request in batch]
    return sent, collator.get_original([f"answer to {r[0]}" for r in sent])


def test_outside_the_sampled_order_it_is_lm_evals_collator() -> None:
    requests = _requests(30)
    sent, answers = _sent(requests, None)
    assert sent == sorted(requests, key=lambda r: -len(r[0]))  # longest first
    assert answers == [f"answer to {r[0]}" for r in requests]


def test_the_sampled_order_is_the_seeds_whatever_order_lm_eval_passed_and_answers_stay_in_place() -> None:
    requests = _requests(30)
    shuffled = random.Random(5).sample(requests, len(requests))
    first, answers = _sent(requests, 7)
    again, shuffled_answers = _sent(shuffled, 7)
    other, _ = _sent(requests, 8)
    assert first == again != other
    assert sorted(first) == sorted(requests) and first != sorted(requests, key=lambda r: -len(r[0]))
    assert answers == [f"answer to {r[0]}" for r in requests]
    assert shuffled_answers == [f"answer to {r[0]}" for r in shuffled]


def test_the_sampled_order_is_uniform_in_lm_evals_length_rank() -> None:
    """Over 400 seeds the 8 requests sent first hold each length rank about equally often."""
    n, first, seeds = 40, 8, 400
    counts = [0] * n
    requests = _requests(n)
    for seed in range(seeds):
        sent, _ = _sent(requests, seed)
        for request in sent[:first]:
            counts[requests.index(request)] += 1
    expected = seeds * first / n
    assert sum((c - expected) ** 2 / expected for c in counts) < 80  # chi2, 39 d.o.f.: P ~ 1e-4


def _sync_order_is_sampled(server: Any) -> list[str]:
    """The probed sync path's answers to 30 prompts; asserts the probe is active."""
    from support.lm import completions, generate, probe_installed

    with probe_installed() as probe:
        assert probe is not None
        return generate(completions(server.base_url, num_concurrent=1), 30)


def test_a_pipeline_that_replaced_collator_by_a_function_still_gets_a_probe_and_the_sampled_order(
    sim, result_dir, monkeypatch
) -> None:
    """A function cannot be subclassed: the probe wraps it instead of failing to install (which
    ran the whole evaluation unprobed), and the pipeline's function stays after uninstall."""
    import lm_eval.models.api_models as api_models

    made: list[Any] = []

    def pipeline_collator(arr: Any, *args: Any, **kwargs: Any) -> Any:
        collator = Collator(arr, *args, **kwargs)
        made.append(collator)
        return collator

    monkeypatch.setattr(api_models, "Collator", pipeline_collator)
    server = sim("never_stop")
    answers = _sync_order_is_sampled(server)
    assert server.snapshot()["generate_requests"] == 16 and answers.count("") == 14
    assert made and api_models.Collator is pipeline_collator


def test_a_pipeline_subclass_of_the_probes_collator_survives_uninstall(sim, result_dir) -> None:
    """Installed after the probe, a pipeline's subclass of the probe's Collator inherits its
    marker: uninstall must not take it for the probe's own and put lm-eval's back over it."""
    import lm_eval.models.api_models as api_models

    from probe.runtime import install

    original = api_models.Collator
    assert install.install()
    try:

        class PipelineCollator(api_models.Collator):  # type: ignore[misc, name-defined]
            pass

        api_models.Collator = PipelineCollator
    finally:
        install.uninstall()
    try:
        assert api_models.Collator is PipelineCollator
    finally:
        api_models.Collator = original


def test_copies_of_one_prompt_are_spread_over_the_order_not_sent_together() -> None:
    """lm-eval's ``repeats`` (self-consistency tasks sample one prompt many times) pass the same
    prompt several times: keyed by the prompt alone, its copies sort next to each other, and the
    first 16 sent are one prompt 16 times (a sample of one prompt, not of the group)."""
    requests = [(f"prompt {i}", KWARGS) for i in range(20) for _ in range(16)]
    sent, answers = _sent(requests, 0)
    assert len({prompt for prompt, _ in sent[:16]}) >= 6
    assert sorted(sent) == sorted(requests)
    assert answers == [f"answer to {r[0]}" for r in requests]


def _run_whole_batches(requests: list, seed: int, n: int, sampled: Any = SAMPLED) -> tuple[list, list, list]:
    """(lm-eval's batches, the batches run in a whole-batches block, the answers put back)."""
    made = list(Collator(requests, sort_fn=lambda r: -len(r[0]), group_by="gen_kwargs").get_batched(n=n))
    with sampled_order(seed, whole_batches=True):
        collator = sampled(requests, sort_fn=lambda r: -len(r[0]), group_by="gen_kwargs")
    ran = list(collator.get_batched(n=n))
    return made, ran, collator.get_original([f"answer to {r[0]}" for batch in ran for r in batch])


# lm-eval's Collator, and a pipeline's function in its place (wrapped, not subclassed).
@pytest.mark.parametrize("sampled", [SAMPLED, sampled_collator(lambda *args, **kwargs: Collator(*args, **kwargs))])
def test_whole_batches_are_lm_evals_own_in_a_seeded_order_and_answers_stay_in_place(sampled: Any) -> None:
    requests = [(f"prompt {'.' * i}", KWARGS if i % 3 else {"max_tokens": 9}) for i in range(30)]  # two groups
    made, ran, answers = _run_whole_batches(requests, 7, 4, sampled)
    assert sorted(ran) == sorted(made) and ran != made  # the same batches, member for member
    assert ran == [made[b] for b in batch_order(7, made)]
    assert answers == [f"answer to {r[0]}" for r in requests]
    # One request a batch: the order that sorting by the seeded hash gives (within a group).
    one_group = _requests(30)
    _, single, _ = _run_whole_batches(one_group, 7, 1)
    assert [batch[0] for batch in single] == _sent(one_group, 7)[0]


def test_the_first_whole_batch_is_uniform_over_lm_evals_batches_whatever_their_sizes() -> None:
    """Over 600 seeds the batch run first is each of 6 (the last one short) about equally often."""
    batches = [[f"b{b}r{r}" for r in range(5 if b < 5 else 1)] for b in range(6)]
    counts = [0] * len(batches)
    for seed in range(600):
        order = batch_order(seed, batches)
        assert sorted(order) == list(range(len(batches)))
        counts[order[0]] += 1
    assert sum((c - 100) ** 2 / 100 for c in counts) < 25  # chi2, 5 d.o.f.: P ~ 1e-4
