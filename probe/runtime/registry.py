"""Every integration of the probe, in one list: what the start-up stub waits for (``inject``
hands it the names) and what the installer installs on each. A new hook module declares its
:class:`~probe.runtime.hooking.integration.Integration` and gets one entry here."""

from __future__ import annotations

from probe.runtime.api_models import api
from probe.runtime.evaluator import caches, evaluations, results
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

# Installed with each integration that runs in lm-eval, before it: lm-eval's caches keep no blank
# answer, and its results file carries the evidence. The start-up stub does not wait for them.
WITH_LM_EVAL: tuple[Integration, ...] = (caches.INTEGRATION, results.INTEGRATION)


def targets() -> tuple[str, ...]:
    """The modules the start-up stub waits for, one per integration."""
    return tuple(integration.waits_for for integration in INTEGRATIONS)


def integration_for(name: str) -> Integration:
    """The integration that waits for the module ``name`` (KeyError for any other)."""
    for integration in INTEGRATIONS:
        if integration.waits_for == name:
            return integration
    raise KeyError(name)
