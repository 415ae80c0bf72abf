"""lm-eval's Collator in the sampled order: a seeded shuffle of each group, answers in place."""

from __future__ import annotations

import random

from lm_eval.models.utils import Collator

from probe.runtime.order import sampled_collator, sampled_order

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
