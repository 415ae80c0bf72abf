"""The probe on lm-eval's Hugging Face backend changes no answer but to a blank of its own.

In this process, on real ``HFLM.generate_until`` with the echo tiny Llama (it repeats a
prompt's last character, "x" forever, and stops at once after "~"): for many mixes of
prompts, batch sizes and ``MIN_SAMPLES``, the probed answers are the unprobed ones in the
same number and order, except blanks of the probe's own type, and every request is either
observed or answered blank, never both, never neither. Drawn with a fixed seed: the same
cases every run (hypothesis is not in the torch environment).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from support.hf import echo_hflm, hf_requests, in_batch_order

from probe.runtime import install
from probe.runtime.core import contract
from probe.runtime.core.answers import BlankAnswer
from probe.runtime.scope import state

pytestmark = pytest.mark.hf
CASES = 16  # 9 of them trip, 4 of those (seeds 0, 4, 9, 13) inside a batch
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def echo_lm(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return echo_hflm(tmp_path_factory)


def requests(prompts: list[str]) -> list[Any]:
    return hf_requests(prompts, max_gen_toks=MAX_TOKENS)


def case(rng: random.Random) -> tuple[list[str], int, int]:
    """Prompts in a shuffled order, a batch size and MIN_SAMPLES.

    The probe runs lm-eval's batches in a seeded order, so they are made to come in the order
    drawn (``in_batch_order``), and shuffled for lm-eval. A share of them stops at
    once; a stop that brings MIN_SAMPLES observations after enough at the cap trips inside
    its batch."""
    batch, min_samples = rng.randint(1, 5), rng.randint(1, 6)
    stops = rng.choice((0.0, 0.15, 0.3, 0.6, 1.0))  # the share of prompts that stop at once
    ends = ["~" if rng.random() < stops else "x" for _ in range(rng.randint(1, 16))]
    if rng.random() < 0.4:  # whole batches at the cap, then a batch whose first row stops
        full = batch * -(-3 // batch)  # at least 3, so that the stop makes at least 3 of 4
        ends, min_samples = ["x"] * full + ["~"] + ends, full + 1
    prompts = in_batch_order("".join(ends), batch)
    rng.shuffle(prompts)
    return prompts, batch, min_samples


@pytest.mark.parametrize("seed", range(CASES))
def test_probed_answers_are_the_unprobed_ones_or_the_probes_blanks(echo_lm, seed, tmp_path, monkeypatch) -> None:
    prompts, batch, min_samples = case(random.Random(seed))
    monkeypatch.setattr(echo_lm, "batch_size_per_gpu", batch)
    check_answers(echo_lm, prompts, min_samples, tmp_path, monkeypatch)


@pytest.mark.parametrize("seed", [0, 13])  # two of the cases that trip inside a batch (of 4 and of 3)
def test_batch_size_auto_is_probed_as_the_batches_it_detects(echo_lm, seed, tmp_path, monkeypatch, capsys) -> None:
    """``--batch_size auto``: lm-eval measures the largest batch (on CPU, ``max_batch_size``)
    before it generates, and the probe follows the batches it then makes, tripping inside one."""
    prompts, batch, min_samples = case(random.Random(seed))
    monkeypatch.setattr(echo_lm, "batch_size_per_gpu", "auto")
    monkeypatch.setattr(echo_lm, "max_batch_size", batch)
    monkeypatch.setattr(echo_lm, "_max_length", 128)  # the size lm-eval tries batches at
    group = check_answers(echo_lm, prompts, min_samples, tmp_path, monkeypatch)
    assert f"Determined Largest batch size: {batch}" in capsys.readouterr().out
    assert group.tripped and 0 < group.short_circuited < len(prompts)


def check_answers(echo_lm: Any, prompts: list[str], min_samples: int, tmp_path: Any, monkeypatch: Any) -> Any:
    """Unprobed, then probed at ``min_samples``: the same answers but the probe's blanks, each
    request observed or blank; the probe's group for the prompts."""
    unprobed = echo_lm.generate_until(requests(prompts), disable_tqdm=True)
    monkeypatch.setenv(contract.ENV_MIN_SAMPLES, str(min_samples))
    monkeypatch.setenv(contract.ENV_MIN_MAX_TOKENS, "0")
    monkeypatch.setenv("RESULT_DIR", str(tmp_path))
    assert install.install_hf()
    try:
        probe = state.ACTIVE
        probed = echo_lm.generate_until(requests(prompts), disable_tqdm=True)
    finally:
        install.uninstall()
    assert len(probed) == len(unprobed) == len(prompts)
    blank = [isinstance(answer, BlankAnswer) for answer in probed]
    assert all(answer == "" for answer, b in zip(probed, blank, strict=True) if b)
    assert [a for a, b in zip(probed, blank, strict=True) if not b] == [
        a for a, b in zip(unprobed, blank, strict=True) if not b
    ]
    (group,) = list(probe.groups)
    assert group.tally.observed + group.short_circuited == len(prompts)
    assert sum(blank) == group.short_circuited
    assert any(blank) <= group.tripped  # blanks only after a trip
    if group.tripped:
        assert group.tally.observed >= min_samples and (tmp_path / contract.SIDECAR_NAME).exists()
    else:
        assert list(probed) == list(unprobed) and not any(blank)
    return group
