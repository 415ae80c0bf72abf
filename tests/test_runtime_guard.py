"""The rule of the injected runtime: standard library, lm_eval, vllm (and ray) only, never ``probe``.

Every test environment has lm-eval-probe installed, so a convenient ``from probe.x import y``
inside the runtime would pass every other test and break every InferenceX run. These two
tests catch it: one reads the injected text, one runs it where ``probe`` cannot be imported.
"""

from __future__ import annotations

import ast
import gc
import io
import json
import subprocess
import sys
import tokenize

from support.procs import PYTHON, probe_site

from probe.demo.localtask import offline_env
from probe.inject import RUNTIME, _source, compact, docstring, embedded_sources, runtime_modules, sitecustomize_text
from probe.runtime.core import contract
from probe.runtime.hooking.bootstrap import PACKAGE, unpack

# ray: the driver joins Ray itself (replicas._join_ray), imported only with data parallelism.
ALLOWED = set(sys.stdlib_module_names) | {"lm_eval", "vllm", "ray", PACKAGE, "__future__"}


def parse(source: str, name: str) -> ast.Module:
    """``ast.parse`` with the garbage collector held off while it builds the tree.

    CPython 3.11 keeps the AST constructor's depth count per interpreter, not per call: a
    collection during the build runs Python code (finalizers of what earlier tests in this worker
    left, and through them other threads), an AST built there resets the count, and the parse
    fails with "AST constructor recursion depth mismatch" (CPython gh-106905; seen once in CI).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, name)
    finally:
        if enabled:
            gc.enable()


def imports(source: str, name: str) -> list[tuple[str, int]]:
    """Every (module, level) a source imports, at any depth."""
    found = []
    for node in ast.walk(parse(source, name)):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", node.level))
    return found


def injected_sources() -> dict[str, str]:
    """Everything the injected text runs: the text itself (the stub in it), the chain, each module."""
    text = sitecustomize_text(chain=True)
    literals = {}
    for node in ast.walk(parse(text, "sitecustomize.py")):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            name = getattr(node.targets[0], "id", "")
            if name in ("chain", "modules"):
                literals[name] = node.value.value
    assert set(literals) == {"chain", "modules"}
    # The modules travel packed: unpacked exactly as the stub unpacks them where it runs.
    modules = {f"modules[{name}]": source for name, source in unpack(literals.pop("modules")).items()}
    assert len(modules) == len(embedded_sources())
    return {"sitecustomize.py": text, **literals, **modules}


def test_the_injected_text_imports_only_the_standard_library_lm_eval_and_vllm() -> None:
    problems = []
    for name, source in injected_sources().items():
        for module, level in imports(source, name):
            if level:
                problems.append(f"{name}: relative import (level {level}) of {module!r}")
            elif module.split(".")[0] not in ALLOWED:
                problems.append(f"{name}: imports {module!r}")
    assert problems == []


def test_every_runtime_file_is_embedded() -> None:
    # Every file of every folder, a folder's __init__ as the package itself ("core").
    on_disk = {
        ".".join(p.parts[:-1] if p.stem == "__init__" else p.with_suffix("").parts)
        for p in (path.relative_to(RUNTIME) for path in RUNTIME.rglob("*.py"))
    }
    assert set(embedded_sources()) == on_disk - {"", "hooking.bootstrap", "hooking.chain"}
    assert {"core.rule", "scope.state", "vllm.vllm_offline", "api_models.api", "install"} <= on_disk


def test_injected_runtime_trips_real_lm_eval_where_probe_cannot_be_imported(sim, local_task, tmp_path) -> None:
    # A directory first on PYTHONPATH whose `probe` and `patcher` refuse to import: the
    # installed lm-eval-probe is out of reach, as it is in an InferenceX container.
    blocker = tmp_path / "blocker"
    for package in ("probe", "patcher"):
        (blocker / package).mkdir(parents=True)
        (blocker / package / "__init__.py").write_text(f"raise ImportError('{package} must not be imported here')\n")
    site = probe_site(tmp_path / "site")
    output = tmp_path / "out"
    env = offline_env(None, PYTHONPATH=f"{site}:{blocker}", RESULT_DIR=str(output))
    work = tmp_path / "cwd"  # not the checkout: `python -m` puts the working directory first on sys.path
    work.mkdir()
    check = subprocess.run([PYTHON, "-c", "import probe"], env=env, cwd=work, capture_output=True, text=True)
    assert "probe must not be imported here" in check.stderr

    server = sim("never_stop")
    command = local_task.lm_eval_command(server.base_url, "sim", output, 2048, 16, model_args="max_retries=2")
    run = subprocess.run(command, env=env, cwd=work, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "[lm-eval-probe] tripped" in run.stderr
    assert "failed to load" not in run.stderr and "internal error" not in run.stderr
    trip = json.loads((output / contract.SIDECAR_NAME).read_text())["verdict"]
    assert (trip["observations"], trip["pathological"]) == (16, 16)
    assert server.snapshot()["generate_requests"] < 40


def _code_only(tree: ast.Module) -> str:
    """The tree's dump and where each node starts, less every docstring (what ``compact`` drops)."""
    for node in ast.walk(tree):
        if docstring(node) is not None:
            node.body = node.body[1:]  # type: ignore[attr-defined]
    starts = [
        (type(node).__name__, getattr(node, "lineno", 0), getattr(node, "col_offset", 0)) for node in ast.walk(tree)
    ]
    return f"{ast.dump(tree)} {starts}"


def test_the_packed_runtime_is_the_same_code_on_the_same_lines() -> None:
    # The packed text drops comments and docstrings only: every statement and expression is where
    # the file in probe/runtime/ has it, so a traceback's line numbers are the repository's.
    for name in runtime_modules():
        source, packed = _source(name), compact(_source(name))
        assert _code_only(parse(packed, name)) == _code_only(parse(source, name)), name
        assert packed.count("\n") == source.count("\n"), name
        tokens = tokenize.generate_tokens(io.StringIO(packed).readline)
        assert not any(token.type == tokenize.COMMENT for token in tokens), name
