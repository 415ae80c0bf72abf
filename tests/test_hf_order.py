"""lm-eval's Hugging Face backend under the probe generates a group's prompts in a seeded
uniform order, not longest first, and gives the answers back in lm-eval's order unchanged.

In this process, on real ``HFLM.generate_until`` with the echo tiny Llama (it repeats a
prompt's last character, "x" forever, and stops at once after "~").
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from support.hf import echo_hflm, hf_requests

from probe.runtime import contract, install, state
from probe.runtime.sampling import DEFAULT_SEED, rank

pytestmark = pytest.mark.hf
MAX_TOKENS = 4


@pytest.fixture(scope="module")
def echo_lm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return echo_hflm(tmp_path_factory.mktemp("models") / "echo")


def probed_run(lm: Any, prompts: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path, min_samples: int) -> tuple:
    """(answers, prompts in the order their rows were observed, the group) of one probed call."""
    monkeypatch.setenv(contract.ENV_MIN_MAX_TOKENS, "0")
    monkeypatch.setenv(contract.ENV_MIN_SAMPLES, str(min_samples))
    monkeypatch.setenv("RESULT_DIR", str(tmp_path))
    assert install.install_hf()
    try:
        probe, seen = state.ACTIVE, []
        observe = probe.observe

        def recording(request: Any, response: Any) -> None:
            seen.extend(request.prompts)
            observe(request, response)

        monkeypatch.setattr(probe, "observe", recording)
        answers = lm.generate_until(hf_requests(prompts, max_gen_toks=MAX_TOKENS), disable_tqdm=True)
    finally:
        install.uninstall()
    (group,) = list(probe.groups)
    return answers, seen, group


@pytest.mark.parametrize("seed", range(3))
def test_rows_are_generated_in_the_seeded_order_whatever_lm_evals_and_answers_stay_put(
    echo_lm, seed, monkeypatch, tmp_path
) -> None:
    rng = random.Random(seed)
    prompts = ["p" * rng.randint(1, 40) + f"{i}x" for i in range(rng.randint(5, 24))]  # distinct, none stops
    echo_lm.batch_size_per_gpu = rng.randint(2, 6)
    unprobed = echo_lm.generate_until(hf_requests(prompts, max_gen_toks=MAX_TOKENS), disable_tqdm=True)
    answers, seen, group = probed_run(echo_lm, prompts, monkeypatch, tmp_path, 10_000)
    assert list(answers) == list(unprobed) and not group.tripped
    # Every row is observed, batch after batch in the order of each prompt's seeded hash: the
    # first observations are a uniform sample, whatever the prompts' lengths or lm-eval's order.
    assert seen == sorted(prompts, key=lambda p: rank(DEFAULT_SEED, repr(p)))


def test_a_model_whose_long_prompts_alone_run_to_the_cap_is_judged_on_a_uniform_sample(
    echo_lm, monkeypatch, tmp_path
) -> None:
    # A quarter of the prompts, the longest, never stop; the rest stop at once. Longest first,
    # the first 8 observations would all be at the cap: a trip on a model 75% healthy.
    prompts = ["p" * (60 + i) + "x" for i in range(10)] + ["p" * (10 + i) + "~" for i in range(30)]
    echo_lm.batch_size_per_gpu = 4
    unprobed = echo_lm.generate_until(hf_requests(prompts, max_gen_toks=MAX_TOKENS), disable_tqdm=True)
    answers, seen, group = probed_run(echo_lm, prompts, monkeypatch, tmp_path, 8)
    assert not group.tripped and list(answers) == list(unprobed)
    assert 0 < sum(p.endswith("x") for p in seen[:8]) < 8 and group.tally.observed == len(prompts)
