"""A probe's requests made directly, with no server: real lm-eval Instances registered, then
``Probe.request``, ``partial`` and ``observe`` called as a backend calls them."""

from __future__ import annotations

from lm_eval.api.instance import Instance

from probe.runtime.core import contract
from probe.runtime.scope.state import Probe
from support.lm import completions, prompts

MAX_TOKENS = 4096
GEN_KWARGS = {"until": ["\n\n"], "max_tokens": MAX_TOKENS, "temperature": 0}
LOOP = "The answer is 42 because the sum is 42 and so. "  # a short exact cycle
HEALTHY = (
    "Natalia sold 48 clips in April. In May she sold half as many, 48 / 2 = 24 clips. Altogether she sold "
    "48 + 24 = 72 clips in April and May. The answer is 72."
)


def probe_with_requests(n: int, settings: contract.Settings | None = None, task: str = "t") -> tuple[Probe, list]:
    """A probe for one evaluation that registered ``n`` real lm-eval generate requests of ``task``,
    and the requests it made of them, one prompt each (as a real model object makes them)."""
    probe = Probe(settings or contract.Settings(), evaluation=True)
    texts = prompts(n)
    instances = [
        Instance("generate_until", doc={}, arguments=(text, GEN_KWARGS), idx=i, metadata=(task, i, 1))
        for i, text in enumerate(texts)
    ]
    probe.register(instances)
    lm = completions("http://127.0.0.1:9")
    return probe, [probe.request(lm, GEN_KWARGS, [text], GEN_KWARGS["max_tokens"]) for text in texts]


def response(finish_reason: str, tokens: int, n: int = 1) -> dict:
    choices = [{"index": i, "text": "x", "finish_reason": finish_reason} for i in range(n)]
    return {"choices": choices, "usage": {"completion_tokens": tokens * n}}


def loop_until_flagged(probe: Probe, request, index: int = 0, delta: str = LOOP) -> int:
    """Feed ``delta`` over and over until the choice is flagged; the number of deltas fed."""
    return _loop_until(probe, request, index, delta, request.flagged, 500)


def loop_until_certain(probe: Probe, request, index: int = 0, delta: str = LOOP) -> int:
    """Feed ``delta`` over and over until the choice's flag is certain (it counts for the rule)."""
    return _loop_until(probe, request, index, delta, request.certain, 5000)


def _loop_until(probe: Probe, request, index: int, delta: str, reached: set[int], most: int) -> int:
    for fed in range(1, most):
        probe.partial(request, index, delta)
        if index in reached:
            return fed
    raise AssertionError(f"choice {index} never reached after {most} deltas")
