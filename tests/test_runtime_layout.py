"""The runtime's layout by role: each folder imports only its own modules and the layers below
it, the integrations never import one another, there are no import cycles, and every
integration folder is in the registry."""

from __future__ import annotations

import ast

import pytest

from probe.inject import RUNTIME
from probe.runtime import registry

# Release-independent: it reads source files only.
pytestmark = pytest.mark.release_independent


def integration_folders() -> tuple[str, ...]:
    """The folders that hold the registered integrations: adding a backend is a folder and its
    line in ``registry.INTEGRATIONS``, nothing here."""
    modules = (integration.install.__module__ for integration in registry.INTEGRATIONS)
    return tuple(sorted({module.removeprefix("probe.runtime.").partition(".")[0] for module in modules}))


# Lower layers first. A module may import from its own folder and from any folder of a lower
# layer; the folders of one layer (the integrations) never import one another.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("hooking",),
    ("scope",),
    ("inprocess",),
    integration_folders(),
    ("",),  # the package root: the registry and the installer, which tie the integrations together
)
LAYER = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}


def folder_of(module: str) -> str:
    """``core`` for ``core.rule`` and ``core``; "" for a module of the package root."""
    head, dot, _ = module.partition(".")
    return head if dot or head in LAYER else ""


def runtime_imports() -> dict[str, set[str]]:
    """Each runtime module ("core.rule") and the runtime modules it imports, at any depth."""
    found: dict[str, set[str]] = {}
    for path in RUNTIME.rglob("*.py"):
        parts = path.relative_to(RUNTIME).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("probe.runtime"):
                base = node.module.removeprefix("probe.runtime").lstrip(".")
                for alias in node.names:  # `from probe.runtime.core import rule` names a module
                    candidate = f"{base}.{alias.name}" if base else alias.name
                    targets.add(candidate if (RUNTIME / f"{candidate.replace('.', '/')}.py").exists() else base)
            elif isinstance(node, ast.Import):
                names = (alias.name for alias in node.names)
                targets |= {n.removeprefix("probe.runtime.") for n in names if n.startswith("probe.runtime.")}
        found[name] = targets - {""}
    return found


def test_every_runtime_file_lies_in_a_folder_of_a_layer() -> None:
    unplaced = sorted(name for name in runtime_imports() if folder_of(name) not in LAYER)
    assert unplaced == []
    loose = sorted(p.name for p in RUNTIME.glob("*.py"))
    assert loose == ["__init__.py", "install.py", "registry.py"]


def test_no_module_imports_a_layer_above_it_nor_a_sibling_integration() -> None:
    problems = []
    for name, targets in runtime_imports().items():
        mine = folder_of(name)
        for target in targets:
            theirs = folder_of(target)
            if theirs == mine:
                continue
            if LAYER[theirs] > LAYER[mine]:
                problems.append(f"{name} imports {target}, a layer above it")
            elif LAYER[theirs] == LAYER[mine]:
                problems.append(f"{name} imports {target}, another integration")
    assert problems == []


def test_there_are_no_import_cycles() -> None:
    graph = runtime_imports()
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join((*path[path.index(name) :], name)))
        if name in done:
            return
        for target in sorted(graph.get(name, ())):
            visit(target, (*path, name))
        done.add(name)

    for name in sorted(graph):
        visit(name, ())


def test_every_folder_is_a_layer_or_a_registered_integration() -> None:
    folders = {p.name for p in RUNTIME.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(LAYER) - {""}
    assert {"evaluator", "api_models", "vllm", "huggingface"} <= set(integration_folders())
