"""Installing the runtime into lm-eval, and taking it out again.

What installs where comes from one list, ``integrations.INTEGRATIONS``. The start-up stub
(``bootstrap``) calls :func:`installing_spec` when one of their modules is first imported, or
:func:`install_module` at once when it already is. All are idempotent and never raise: an
error is reported once and that integration's part of lm-eval runs unprobed.
"""

from __future__ import annotations

import atexit
import importlib
import os
import sys
from typing import Any

from probe.runtime.core.contract import read_settings
from probe.runtime.hooking.integration import Integration
from probe.runtime.hooking.patching import hooks_in, own_replacements, restore_all, restore_own
from probe.runtime.hooking.versions import installed_version
from probe.runtime.registry import WITH_LM_EVAL, integration_for
from probe.runtime.scope import state
from probe.runtime.scope.log import forget_said, say, say_once
from probe.runtime.scope.report import mark_active, settle


def install_integration(integration: Integration, module: Any = None) -> bool:
    """Activate the probe and install ``integration`` on its module (imported by name when
    not given); True when it is probed afterwards. A failure is reported once and leaves the
    other integrations as they are: only this one's part runs unprobed. A failure undoes what
    this call put in place, never what an earlier install did (a reinstall under a pipeline's
    wrapper that this one's checks refuse leaves the working install as it was)."""
    with own_replacements() as made:
        return _install(integration, module, made)


def _install(integration: Integration, module: Any, made: list) -> bool:
    try:
        if not (_activate() if integration.in_lm_eval else read_settings()[0].enabled):
            return False
        mark_active()
        for tested in integration.tested:
            say_once(tested.warning(installed_version(tested)))
        if module is None:
            module = importlib.import_module(integration.waits_for)
        for required in WITH_LM_EVAL if integration.in_lm_eval else ():
            required.install(importlib.import_module(required.waits_for))
        # Always: each hook is put in place where it is missing, so one that a pipeline's wrapper
        # kept through an uninstall never stands for the others (install is idempotent per hook).
        integration.install(module)
        return True
    except Exception as error:
        try:
            restore_own(made)
        except Exception as undo:
            say(f"could not undo the partial install on {integration.waits_for}: {undo!r}")
        earlier = module is not None and hooks_in(module)
        say(
            f"could not install on {integration.waits_for} ({error!r}); {integration.unprobed} run(s) unprobed"
            + (", but for the hooks an earlier install put in place" if earlier else "")
        )
        return False


def install(api_models: Any = None) -> bool:
    """Patch lm-eval's API models; True when the probe is active afterwards."""
    return install_integration(integration_for("lm_eval.models.api_models"), api_models)


def install_vllm(vllm_causallms: Any = None) -> bool:
    """Patch lm-eval's in-process vLLM backend (``--model vllm``); True when it is probed."""
    return install_integration(integration_for("lm_eval.models.vllm_causallms"), vllm_causallms)


def install_hf(huggingface: Any = None) -> bool:
    """Patch lm-eval's Hugging Face backend (``--model hf``); True when it is probed."""
    return install_integration(integration_for("lm_eval.models.huggingface"), huggingface)


def install_module(module: Any) -> bool:
    """Install the integration that waits for ``module``, whichever it is."""
    return install_integration(integration_for(module.__name__), module)


# Whether the exit handler is registered: once per process, however often it is installed.
_AT_EXIT = False


def _activate() -> bool:
    """Make the process's probe on first use; False when off."""
    settings, warnings = read_settings()
    for warning in warnings:
        say_once(warning)
    if not settings.enabled:
        return False
    global _AT_EXIT
    if not _AT_EXIT:
        _AT_EXIT = True
        atexit.register(_finalise_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=state.forked)
    state.activate(settings)
    return True


def uninstall() -> None:
    """Restore every patched original and forget the probe's state."""
    restore_all()
    state.forget()
    forget_said()


class _InstallingLoader:
    """Runs the real loader of a module an integration waits for, then installs that integration."""

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
    """The real spec of a module an integration waits for, whose loader installs it after it ran.

    Called by the start-up stub's finder on every look-up of ``fullname``; asked again by
    this look-up, the stub answers None, so the spec comes from the real finders.
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
    settle(scope for scope in state.SCOPES if not scope.reported)
