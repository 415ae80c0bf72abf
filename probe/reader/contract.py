"""The evaluation contract: the probe's effective settings, and a fingerprint of them.

Read exactly the way the body reads them (the parsing code is the body's own), so two
runs made under different effective settings never fingerprint as comparable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from probe.runtime.core.contract import read_settings, settings_fingerprint


def contract_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Every probe knob's effective value, defaults included, keyed by variable name."""
    settings, _ = read_settings(os.environ if environ is None else environ)
    return settings.as_dict()


def contract_fingerprint(environ: Mapping[str, str] | None = None) -> str:
    """A stable hash of :func:`contract_settings`."""
    settings, _ = read_settings(os.environ if environ is None else environ)
    return settings_fingerprint(settings)
