"""How each group's sample is drawn: a seeded hash of each prompt (pure).

The requests of smallest rank form the sample, sent first (``order``) and judged by the rule
(``rule``). For a given seed the sample is reproducible and does not depend on the order lm-eval used.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# The seed every run uses: the same prompts are judged in the same order, run after run.
DEFAULT_SEED = 0
METHOD = "seeded-sample-first"


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
            "order": "each group's sample (the requests of smallest seeded rank of their prompt) is sent first, "
            "then every other request in lm-eval's order; the Hugging Face backend draws whole batches",
        }
