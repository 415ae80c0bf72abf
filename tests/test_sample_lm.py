"""The sample with real lm-eval (0.4.13's API models) against the simulated server: each task's
sample is its own, settings lm-eval groups together are one group, and with several prompts a
request a never-stopping model still gets exactly MIN_SAMPLES generations before the trip."""

from __future__ import annotations

from typing import Any

import pytest
from lm_eval.api.instance import Instance
from support.lm import completions, probe_installed

from probe.runtime.core import contract

A = {"until": ["\n\n"], "max_tokens": 2048, "temperature": 0}


def _prompt(tag: str, i: int, pad: int) -> str:
    return f"{tag} item {i}. " + "x" * pad + f"\nQuestion: What is {i} + {2 * i + 1}?\nAnswer:"


def test_a_small_task_beside_a_large_one_is_judged_on_its_own_sample(sim, result_dir) -> None:
    """Task B (100 prompts, a quarter of them at the cap: its longest) runs beside task A (1,000
    healthy prompts) in one generate_until. Sampled together, B got a few of the 64 sampled
    places, the rest of its sample came longest first, and B was blanked (hostile round 46)."""
    b_settings = {**A, "top_p": 1.0}
    requests = [Instance("generate_until", {}, (_prompt("A", i, 10), A), i, metadata=("a", i, 1)) for i in range(1000)]
    requests += [
        Instance("generate_until", {}, (_prompt("B", i, 100 + i), b_settings), i, metadata=("b", i, 1))
        for i in range(100)
    ]
    server = sim("mixed", cap_min_chars=len(_prompt("B", 75, 175)))
    assert sum(server.at_cap(r.args[0]) for r in requests) == 25
    with probe_installed() as probe:
        answers = completions(server.base_url, num_concurrent=8).generate_until(requests)
        document = probe.evidence_document()
    assert "" not in answers and not document["tripped"]
    assert [g["sample"]["generations"] for g in document["groups"]] == [16, 16]


@pytest.mark.parametrize(
    ("a_settings", "b_settings"),
    [(A, {**A, "temperature": 0.0}), ({**A, "until": ["."]}, {**A, "until": "."})],
)
def test_settings_lm_eval_groups_together_are_one_group_and_each_task_is_told_its_blanks(
    sim, result_dir, a_settings, b_settings
) -> None:
    """temperature 0 and 0.0, or until "." and ["."], are one group to lm-eval (it compares
    (name, tuple(value)) with ==): the trip blanks both tasks' requests, and each task's evidence
    says so (hostile rounds 46 and 47: one task's blanks were filed under the other)."""
    requests = [
        Instance("generate_until", {}, (f"A{i}: What is {i} + {i}?", a_settings), i, metadata=("a", i, 1))
        for i in range(40)
    ]
    requests += [
        Instance("generate_until", {}, (f"B{i}: What is {i} + {i + 1}?", b_settings), i, metadata=("b", i, 1))
        for i in range(60)
    ]
    server = sim("never_stop", seconds_per_token=0.00002)
    with probe_installed() as probe:
        answers = completions(server.base_url, num_concurrent=8).generate_until(requests)
        document = probe.evidence_document()
    (group,) = document["groups"]
    assert group["tasks"] == ["a", "b"] and group["tripped"]
    tasks = document["tasks"]
    for name, answered in (("a", answers[:40]), ("b", answers[40:])):
        evidence = tasks[name]
        assert evidence["tripped"] and evidence["short_circuited"] == answered.count("")
        assert evidence["observations"] + evidence["short_circuited"] == evidence["generate_requests"]


@pytest.mark.parametrize(("concurrency", "batch", "n"), [(8, 4, 100), (16, 4, 200), (64, 8, 400)])
def test_several_prompts_a_request_still_send_min_samples_generations_before_the_trip(
    sim, result_dir, concurrency: int, batch: int, n: int
) -> None:
    """The slow start counts generations, not requests: 16 of them at the cap, then the trip
    (it counted requests: 128 generations ran to the cap at C=64 and batch_size 8)."""
    server = sim("never_stop")
    prompts = [f"Question: What is {i} + {2 * i + 1}?\nAnswer:" for i in range(n)]
    requests = [Instance("generate_until", {}, (text, dict(A)), i) for i, text in enumerate(prompts)]
    with probe_installed():
        lm: Any = completions(server.base_url, num_concurrent=concurrency, batch_size=batch)
        lm.generate_until(requests)
    stats = server.snapshot()
    assert (result_dir / contract.SIDECAR_NAME).exists()
    assert stats["tokens_generated"] == 16 * 2048 and stats["generate_requests"] == 16 // batch
