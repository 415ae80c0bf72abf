"""Every integration installs and uninstalls through its own declaration, as OpenTelemetry's
instrumentations are tested: after ``uninstall`` every attribute of its module, and of each
class it patched, is the original object again, and a real call runs untouched."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from support.procs import PYTHON
from support.vllm import vllm_python

from probe.demo.localtask import offline_env
from probe.runtime import registry

# Checked in a fresh interpreter: no other test's hooks are in the way, and none is left behind.
CHECK = textwrap.dedent(
    """
    import importlib, json, sys
    from probe.runtime import install, registry
    from probe.runtime.hooking import patching

    name = sys.argv[1]
    integration = next(i for i in registry.INTEGRATIONS + registry.WITH_LM_EVAL if i.waits_for == name)
    module = importlib.import_module(name)

    def snapshot():
        owners = [module] + [v for v in vars(module).values() if isinstance(v, type)]
        return {(id(o), k): v for o in owners for k, v in list(vars(o).items())}

    before = snapshot()
    installed = install.install_integration(integration, module)
    hooked = sorted(f"{getattr(o, '__name__', o)}.{k}" for o, k, _ in patching._ORIGINALS)
    integration.uninstall(module)
    for required in registry.WITH_LM_EVAL if integration.in_lm_eval else ():
        required.uninstall(importlib.import_module(required.waits_for))
    after = snapshot()
    changed = sorted(str(k[1]) for k in before if after.get(k) is not before[k])
    left = sorted(f"{getattr(o, '__name__', o)}.{k}" for o, k, _ in patching._ORIGINALS)
    print(json.dumps({"installed": installed, "hooked": hooked, "changed": changed, "left": left}))
    """
)


def check(python: str, name: str) -> dict:
    run = subprocess.run([python, "-c", CHECK, name], env=offline_env(None), capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


# Where each integration's module imports: vLLM's in its environment, the Hugging Face backend's
# with torch (the hf pass runs in that environment too), the rest with lm-eval alone.
NEEDS = {"lm_eval.models.vllm_causallms": "vllm", "vllm.entrypoints.llm": "vllm", "lm_eval.models.huggingface": "hf"}
CASES = [
    pytest.param(i.waits_for, marks=[getattr(pytest.mark, NEEDS[i.waits_for])] if i.waits_for in NEEDS else [])
    for i in registry.INTEGRATIONS + registry.WITH_LM_EVAL
]


def test_every_integration_is_checked() -> None:
    assert {case.values[0] for case in CASES} == {i.waits_for for i in registry.INTEGRATIONS + registry.WITH_LM_EVAL}


@pytest.mark.parametrize("name", CASES)
def test_an_integration_installs_and_uninstalls_to_the_originals(name: str) -> None:
    found = check(vllm_python() if NEEDS.get(name) == "vllm" else PYTHON, name)
    assert found["installed"] is True and found["hooked"], found
    assert found["changed"] == [] and found["left"] == [], found


def test_an_uninstalled_api_model_answers_as_lm_eval_does(sim) -> None:
    # A real generation after install and uninstall: the model's own answer, nothing of the probe.
    script = textwrap.dedent(
        """
        import sys
        from lm_eval.models.openai_completions import LocalCompletionsAPI
        from probe.runtime import install, registry
        from probe.runtime.hooking import patching
        from lm_eval.api.instance import Instance

        api = registry.integration_for("lm_eval.models.api_models")
        module = sys.modules["lm_eval.models.api_models"]
        install.install_integration(api, module)
        install.uninstall()
        lm = LocalCompletionsAPI(base_url=sys.argv[1], model="sim", tokenizer_backend=None, max_retries=1)
        request = Instance("generate_until", {}, ("Q: 2+3?", {"until": ["\\n\\n"], "max_gen_toks": 64}), 0)
        print(repr(lm.generate_until([request])[0]), type(lm.generate_until([request])[0]).__name__,
              patching._ORIGINALS == [])
        """
    )
    server = sim("healthy")
    run = subprocess.run([PYTHON, "-c", script, f"{server.base_url}/v1/completions"], env=offline_env(None),
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    answer, kind, clean = run.stdout.split()[-3:]
    assert kind == "str" and clean == "True" and answer != "''", run.stdout
    assert "[lm-eval-probe]" not in run.stderr
