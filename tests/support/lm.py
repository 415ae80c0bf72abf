"""Building real lm-eval API models and requests against a server on 127.0.0.1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lm_eval.api.instance import Instance
from lm_eval.models.api_models import JsonChatStr
from lm_eval.models.openai_completions import LocalChatCompletion, LocalCompletionsAPI

GEN_KWARGS = {"until": ["\n\n"], "max_tokens": 2048, "temperature": 0}


# What every test model shares: no tokenizer, prompts sent as text, few retries.
COMMON = {"model": "sim", "tokenizer_backend": None, "tokenized_requests": False, "max_retries": 2}


def completions(base_url: str, num_concurrent: int = 8, batch_size: int = 1, **extra: Any) -> LocalCompletionsAPI:
    url = f"{base_url}/v1/completions"
    return LocalCompletionsAPI(base_url=url, num_concurrent=num_concurrent, batch_size=batch_size, **COMMON, **extra)


def chat(base_url: str, num_concurrent: int = 8, model: type[LocalChatCompletion] = LocalChatCompletion) -> Any:
    """lm-eval's local chat model (or ``model``, a subclass: its OpenAI chat model, a pipeline's own)."""
    return model(base_url=f"{base_url}/v1/chat/completions", num_concurrent=num_concurrent, **COMMON)


def prompts(n: int) -> list[str]:
    return [f"Question: What is {i} + {2 * i + 1}?\nAnswer:" for i in range(n)]


def generate(lm: Any, n: int, gen_kwargs: dict | None = None, chat_format: bool = False) -> list[str]:
    """Run lm-eval's own generate_until on ``n`` arithmetic prompts."""
    kwargs = dict(GEN_KWARGS if gen_kwargs is None else gen_kwargs)
    requests = []
    for i, text in enumerate(prompts(n)):
        context: Any = JsonChatStr(json.dumps([{"role": "user", "content": text}])) if chat_format else text
        requests.append(Instance(request_type="generate_until", doc={}, arguments=(context, kwargs), idx=i))
    return lm.generate_until(requests)


@contextmanager
def probe_installed() -> Iterator[Any]:
    """The probe installed on the real lm-eval in this process for the block, then taken out."""
    from probe.runtime import install
    from probe.runtime.scope import state

    assert install.install()
    try:
        yield state.ACTIVE
    finally:
        install.uninstall()


def settled(server: Any) -> dict:
    """The server's counters once nothing is in flight there (or 5 s have passed): a stream the
    client closed is counted as aborted when the server notices, a moment after lm-eval returns."""
    returned = time.monotonic()
    while server.snapshot()["in_flight"] and time.monotonic() - returned < 5:
        time.sleep(0.01)
    return server.snapshot()
