"""What the patcher puts into files: handed to it, so that it never imports the probe."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Payload:
    """The probe's sitecustomize text in its two variants, with its version and digest.

    ``appended`` goes after someone else's start-up code; ``standalone`` is a file of our
    own, which also runs the ``sitecustomize.py`` it shadows.
    """

    version: str
    digest: str
    appended: str
    standalone: str

    @property
    def label(self) -> str:
        return f"lm-eval-probe {self.version} (body {self.digest})"
