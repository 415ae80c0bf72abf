"""Every integration of the probe, in one list: what the start-up stub waits for (``inject``
hands it the names) and what the installer installs on each. A new hook module declares its
:class:`~probe.runtime.hooking.integration.Integration` and gets one entry here."""

from __future__ import annotations

from probe.runtime.api_models import api
from probe.runtime.evaluator import evaluations
from probe.runtime.hooking.integration import Integration
from probe.runtime.huggingface import hf
from probe.runtime.vllm import replica_engine, vllm_offline

INTEGRATIONS: tuple[Integration, ...] = (
    evaluations.INTEGRATION,
    api.INTEGRATION,
    vllm_offline.INTEGRATION,
    hf.INTEGRATION,
    replica_engine.INTEGRATION,
)


def targets() -> tuple[str, ...]:
    """The modules the start-up stub waits for, one per integration."""
    return tuple(integration.waits_for for integration in INTEGRATIONS)


def integration_for(name: str) -> Integration:
    """The integration that waits for the module ``name`` (KeyError for any other)."""
    for integration in INTEGRATIONS:
        if integration.waits_for == name:
            return integration
    raise KeyError(name)
