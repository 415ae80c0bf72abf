"""The shape of one integration: what a hook module declares.

ddtrace's and OpenTelemetry's instrumentations work the same way.
The installer and the start-up stub work from one list (``registry.INTEGRATIONS``).
So a new backend cannot skip a step. See docs/layout.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from probe.runtime.hooking.versions import Tested


@dataclass(frozen=True)
class Integration:
    """One module of the host program the probe hooks into, and how."""

    waits_for: str  # the module's name: the start-up stub installs right after it is imported
    # Patch the module: each hook where it is missing, so that it completes a partial install;
    # raise, having patched nothing, to refuse.
    install: Callable[[Any], None]
    uninstall: Callable[[Any], None]  # restore every original ``install`` replaced
    # The releases of the programs the module drives that the suite runs against: each one
    # outside its range gets one warning when the integration installs.
    tested: tuple[Tested, ...]
    unprobed: str  # what runs unprobed when installing fails, in words ("lm-eval's vLLM backend")
    # False for a module that also runs where lm-eval's evaluation does not (a vLLM replica):
    # installing it then makes no probe scope and touches none of lm-eval's modules.
    in_lm_eval: bool = True
