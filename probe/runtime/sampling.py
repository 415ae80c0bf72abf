"""The order in which a group's requests are judged: a seeded sample, never lm-eval's (pure).

lm-eval sends the requests of a group longest prompt first, and long prompts tend to have
long answers, so the first observations in lm-eval's order are a biased sample. Every backend
therefore puts its requests in an order of its own: every backend has lm-eval's own ordering
replaced by a seeded hash of each prompt (``order``: what the sync API path and vLLM send
first, and which prompts share a request; the Hugging Face backend keeps lm-eval's batches and
runs them in a seeded order), and the async API path also releases its calls
from its gate in a seeded random order (``gate``). For a given
seed the order is reproducible; it does not depend on the order lm-eval used.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# The seed every run uses: the same prompts are judged in the same order, run after run.
DEFAULT_SEED = 0
METHOD = "seeded-uniform-order"


def rank(seed: int | str, key: str) -> int:
    """A pseudo-random number fixed by ``seed`` and ``key``: sorting by it is a seeded shuffle."""
    return int.from_bytes(hashlib.sha256(f"{seed}\0{key}".encode()).digest()[:8], "big")


@dataclass(frozen=True)
class Sampling:
    """How this process orders the requests the rule judges (recorded in the evidence)."""

    seed: int = DEFAULT_SEED

    def as_dict(self) -> dict[str, object]:
        return {
            "method": METHOD,
            "seed": self.seed,
            "async": "lm-eval's longest-first order is replaced by a seeded hash of each prompt (which prompts "
            "share a request), and the gate releases parked calls in an order drawn from the seed",
            "sync": "lm-eval's longest-first order is replaced by a seeded hash of each prompt",
            "vllm": "lm-eval's longest-first order is replaced by a seeded hash of each prompt",
            "hf": "lm-eval's batches are kept as they are and run in a seeded order of whole batches (a cluster "
            "sample of batches)",
        }
