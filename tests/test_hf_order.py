"""lm-eval's Hugging Face backend under the probe runs lm-eval's own batches, unchanged, in a
seeded order of whole batches (not longest first), and gives the answers back in lm-eval's order.

In this process, on real ``HFLM.generate_until``: the echo tiny Llama (it repeats a prompt's
last character, "x" forever, and stops at once after "~"), and the varied one in bfloat16,
whose greedy answers change when a prompt's batch (so its padding) changes.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from support.hf import echo_hflm, hf_requests, tiny_llama

from probe.runtime import install
from probe.runtime.core import contract
from probe.runtime.core.sampling import DEFAULT_SEED
from probe.runtime.inprocess.order import batch_order
from probe.runtime.scope import state

pytestmark = pytest.mark.hf
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def echo_lm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return echo_hflm(tmp_path_factory)


@pytest.fixture(scope="module")
def varied_lm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from lm_eval.models.huggingface import HFLM

    model = tiny_llama("varied", tmp_path_factory)
    return HFLM(pretrained=str(model), device="cpu", dtype="bfloat16", batch_size=8)


def run(lm: Any, prompts: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path, min_samples: int | None, **gen) -> dict:
    """One ``generate_until`` call, probed unless ``min_samples`` is None: its answers, the
    batches lm-eval encoded (their prompts, in the order run), the prompts in the order their
    rows were observed, and the group."""
    from lm_eval.models.huggingface import HFLM

    batches: list[list[str]] = []
    encode = HFLM.tok_batch_encode

    def recording(self: Any, strings: Any, *args: Any, **kwargs: Any) -> Any:
        batches.append(list(strings))
        return encode(self, strings, *args, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(HFLM, "tok_batch_encode", recording)  # under the probe's wrapper, when probed
        requests = hf_requests(prompts, **{"max_gen_toks": MAX_TOKENS, **gen})
        if min_samples is None:
            return {"answers": list(lm.generate_until(requests, disable_tqdm=True)), "batches": batches}
        patched.setenv(contract.ENV_MIN_MAX_TOKENS, "0")
        patched.setenv(contract.ENV_MIN_SAMPLES, str(min_samples))
        patched.setenv("RESULT_DIR", str(tmp_path))
        assert install.install_hf()
        try:
            probe, seen = state.ACTIVE, []
            observe = probe.observe

            def observing(request: Any, response: Any) -> None:
                seen.extend(request.prompts)
                observe(request, response)

            patched.setattr(probe, "observe", observing)
            answers = list(lm.generate_until(requests, disable_tqdm=True))
        finally:
            install.uninstall()
    (group,) = list(probe.groups)
    return {"answers": answers, "batches": batches, "seen": seen, "group": group}


def test_a_healthy_bfloat16_model_answers_as_unprobed_in_lm_evals_batches(varied_lm, monkeypatch, tmp_path) -> None:
    rng = random.Random(3)
    prompts = ["".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randint(5, 120))) for _ in range(48)]
    gen = {"until": ["\n\n"], "max_gen_toks": 24}
    unprobed = run(varied_lm, prompts, monkeypatch, tmp_path, None, **gen)
    probed = run(varied_lm, prompts, monkeypatch, tmp_path, 10_000, **gen)  # a rule that cannot fire
    assert probed["answers"] == unprobed["answers"]
    assert len(set(unprobed["answers"])) > 10  # varied text: answers that depend on the prompt
    # lm-eval's batches, each one whole, in another order: the first run are not its longest.
    assert sorted(probed["batches"]) == sorted(unprobed["batches"]) and len(unprobed["batches"]) == 6
    assert probed["batches"][0] != unprobed["batches"][0]
    assert probed["group"].tally.observed == len(prompts) and not probed["group"].tripped


@pytest.mark.parametrize("seed", range(3))
def test_batches_run_in_the_seeded_order_of_whole_batches_and_answers_stay_put(
    echo_lm, seed, monkeypatch, tmp_path
) -> None:
    rng = random.Random(seed)
    batch = echo_lm.batch_size_per_gpu = rng.randint(2, 5)
    n = rng.randint(4 * batch - 1, 5 * batch)  # 4 or 5 batches, the last maybe short
    prompts = ["p" * rng.randint(1, 40) + f"{i}x" for i in range(n)]  # distinct, none stops
    unprobed = run(echo_lm, prompts, monkeypatch, tmp_path, None)
    probed = run(echo_lm, prompts, monkeypatch, tmp_path, 10_000)
    assert probed["answers"] == unprobed["answers"] and not probed["group"].tripped
    made = unprobed["batches"]
    assert probed["batches"] == [made[b] for b in batch_order(DEFAULT_SEED, made)] != made
    # Every row observed, batch after batch, in the order run.
    first = probed["batches"][0]
    assert sorted(probed["seen"][: len(first)]) == sorted(first)
    assert sorted(probed["seen"]) == sorted(prompts)


def test_a_model_whose_long_prompts_alone_run_to_the_cap_is_judged_on_a_sample_of_batches(
    echo_lm, monkeypatch, tmp_path
) -> None:
    # A quarter of the prompts, the longest, never stop; the rest stop at once. Longest first,
    # the first 8 observations (two batches of 4) would all be at the cap: a trip on a model
    # 75% healthy. Two random batches of the 10 are all at the cap with probability 1/45.
    prompts = ["p" * (60 + i) + "x" for i in range(10)] + ["p" * (10 + i) + "~" for i in range(30)]
    echo_lm.batch_size_per_gpu = 4
    unprobed = run(echo_lm, prompts, monkeypatch, tmp_path, None)
    probed = run(echo_lm, prompts, monkeypatch, tmp_path, 8)
    assert not probed["group"].tripped and probed["answers"] == unprobed["answers"]
    assert 0 < sum(p.endswith("x") for p in probed["seen"][:8]) < 8
    assert probed["group"].tally.observed == len(prompts)
