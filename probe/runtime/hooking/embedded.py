"""Serves the packed runtime as a package (``_hyperloom_eval_probe``).

It travels packed with the runtime, so a process that never imports lm-eval never compiles it.
The stub compiles it when the runtime first loads (``bootstrap.load_runtime``).
"""

from __future__ import annotations

from importlib.machinery import ModuleSpec
from types import ModuleType


class EmbeddedRuntime:
    """A meta-path finder and loader for the package ``serves`` and its modules, from source text."""

    def __init__(self, serves: str, sources: dict[str, str], origin: str) -> None:
        self.serves = serves
        self.sources = sources
        self.origin = origin

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> ModuleSpec | None:
        package, _, name = fullname.partition(".")
        if package != self.serves or (name and name not in self.sources):
            return None
        inner = name + "."  # a folder of the runtime ("core") is a package of its own
        is_package = not name or any(key.startswith(inner) for key in self.sources)
        return ModuleSpec(fullname, self, origin=self.origin, is_package=is_package)

    def create_module(self, spec: ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__.partition(".")[2]
        if name:
            where = f"{self.origin} (lm-eval-probe {name})"
            exec(compile(self.sources[name], where, "exec"), module.__dict__)
