"""The streaming policy of every backend: whether partial outputs are worth asking for (pure)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from probe.runtime.core.contract import Settings


def wanted(settings: Settings, requests: Iterable[Any]) -> bool:
    """Whether partial outputs of ``requests`` are worth asking for, from vLLM's engine or a server's stream.

    Only the loop detector reads them, and only for requests that are evidence.
    HYPERLOOM_EVAL_PROBE_STREAM=off asks for none, so the cap rule judges alone.
    """
    return settings.detector and settings.stream != "off" and any(request.is_evidence for request in requests)
