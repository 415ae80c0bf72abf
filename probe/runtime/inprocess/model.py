"""What the sidecar says of a model lm-eval runs in-process."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class OfflineModel:
    """What the sidecar says about the model: its path, and no server (there is none)."""

    model: str | None
    base_url: None = None
