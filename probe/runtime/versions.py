"""Which lm-eval is running, and whether the suite was run against it."""

from __future__ import annotations

from probe.runtime.contract import TESTED_LM_EVAL, is_tested_lm_eval


def lm_eval_version() -> str | None:
    """The installed lm-eval's version string, or None when it cannot be told."""
    try:
        from importlib.metadata import version

        return version("lm_eval")
    except Exception:
        return None


def untested_warning(version: str | None) -> str | None:
    """A warning when ``version`` lies outside the tested range, else None."""
    if version is None or is_tested_lm_eval(version):
        return None
    low, high = (".".join(map(str, v)) for v in TESTED_LM_EVAL)
    # InferenceX's lm-eval, commit b315ef3, calls itself 0.4.9.2 and is tested too: say so.
    return (
        f"lm-eval {version} is outside what this probe was tested with (the releases {low} to {high}, and "
        "InferenceX's lm-eval (b315ef3), which calls itself 0.4.9.2); the probe stays active, but check its "
        "findings, and report a problem if you see one"
    )
