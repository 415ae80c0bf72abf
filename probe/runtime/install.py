"""Installing the runtime into lm-eval, and taking it out again.

The start-up stub (``bootstrap``) calls :func:`installing_spec` when one of the lm-eval
modules in :data:`INSTALLERS` is first imported, or :func:`install_module` at once when it already is. All
are idempotent and never raise: an error is reported once and lm-eval runs unprobed.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from typing import Any

from probe.runtime import state
from probe.runtime.api import install_api, is_installed
from probe.runtime.caches import guard_caches
from probe.runtime.contract import ENV_REPORT, read_settings
from probe.runtime.hf import install_hf as install_hf_backend
from probe.runtime.hf import is_installed as is_hf_installed
from probe.runtime.log import say
from probe.runtime.patching import restore_all
from probe.runtime.results import carry_evidence
from probe.runtime.sidecar import write_json_atomic
from probe.runtime.versions import lm_eval_version, untested_warning
from probe.runtime.vllm_offline import install_vllm as install_offline_vllm
from probe.runtime.vllm_offline import is_installed as is_vllm_installed


def install(api_models: Any = None) -> bool:
    """Patch lm-eval's API models; True when the probe is active afterwards."""
    try:
        return _install_backend(api_models, "lm_eval.models.api_models", is_installed, install_api)
    except Exception as error:
        say(f"could not install ({error!r}); lm-eval runs unprobed")
        uninstall()
        return False


def install_vllm(vllm_causallms: Any = None) -> bool:
    """Patch lm-eval's in-process vLLM backend (``--model vllm``); True when it is probed.

    A failure here is reported once and leaves the API models' patches as they are: only
    this backend runs unprobed.
    """
    try:
        return _install_backend(vllm_causallms, "lm_eval.models.vllm_causallms", is_vllm_installed,
                                install_offline_vllm)  # fmt: skip
    except Exception as error:
        say(f"could not install on lm-eval's vLLM backend ({error!r}); it runs unprobed")
        return False


def _install_backend(module: Any, name: str, installed: Any, patch: Any) -> bool:
    """Activate the probe and patch one backend's module (imported by ``name`` when not given)."""
    if not _activate():
        return False
    if module is None:
        module = importlib.import_module(name)
    if not installed(module):
        patch(module)
    return True


def install_hf(huggingface: Any = None) -> bool:
    """Patch lm-eval's Hugging Face backend (``--model hf``); True when it is probed.

    As for :func:`install_vllm`, a failure leaves the other backends' patches as they are.
    """
    try:
        return _install_backend(huggingface, "lm_eval.models.huggingface", is_hf_installed, install_hf_backend)
    except Exception as error:
        say(f"could not install on lm-eval's Hugging Face backend ({error!r}); it runs unprobed")
        return False


# What the start-up stub waits for (bootstrap.TARGETS), and what installs on each.
INSTALLERS = {
    "lm_eval.models.api_models": install,
    "lm_eval.models.vllm_causallms": install_vllm,
    "lm_eval.models.huggingface": install_hf,
}


def install_module(module: Any) -> bool:
    """Install on one of the modules in :data:`INSTALLERS`, whichever ``module`` is."""
    return INSTALLERS[module.__name__](module)


# Knob warnings already said: lm-eval 0.4.9.x imports both modules in INSTALLERS, and a
# bad value is one mistake, so it gets one line.
_WARNED: set[str] = set()


def _activate() -> bool:
    """Make the process's probe on first use, and guard both cache layers; False when off."""
    settings, warnings = read_settings()
    for warning in warnings:
        if warning not in _WARNED:
            _WARNED.add(warning)
            say(warning)
    if not settings.enabled:
        return False
    from lm_eval.api import model as api_model
    from lm_eval.loggers import evaluation_tracker

    if state.ACTIVE is None:
        warning = untested_warning(lm_eval_version())
        if warning:
            say(warning)
        state.ACTIVE = state.Probe(settings)
        atexit.register(_finalise_at_exit)
    guard_caches(api_model)
    carry_evidence(evaluation_tracker)
    return True


def uninstall() -> None:
    """Restore every patched original and forget the probe's state."""
    restore_all()
    state.ACTIVE = None
    _WARNED.clear()


class _InstallingLoader:
    """Runs the real loader of an lm-eval module in INSTALLERS, then installs the probe on it."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        install_module(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


def installing_spec(fullname: str, path: Any = None, target: Any = None) -> Any:
    """The real spec of an lm-eval module in INSTALLERS, whose loader installs the probe after it ran.

    Called by the start-up stub's finder, which no longer waits for ``fullname``: asked
    again here, it answers None, so the spec comes from the real finders.
    """
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(fullname, path, target) if find is not None else None
        if spec is not None:
            if spec.loader is not None:
                spec.loader = _InstallingLoader(spec.loader)
            return spec
    return None


def _finalise_at_exit() -> None:
    probe = state.ACTIVE
    if probe is None:
        return
    try:
        probe.finalise()
    except Exception as error:
        say(f"could not add the final counters to the sidecar: {error!r}")
    report = os.environ.get(ENV_REPORT)
    if report:
        try:
            write_json_atomic(report, probe.evidence_document())
        except Exception as error:
            say(f"could not write the observation report {report}: {error!r}")
