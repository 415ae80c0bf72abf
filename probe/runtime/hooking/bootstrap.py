"""Start-up stub: runs in every Python process that has the probe's sitecustomize.py.

It stays tiny, since every such process compiles it from source.
It only registers a finder that waits for the modules the integrations hook.
The runtime travels packed and is compiled when the first of them is imported.
It then installs right after that module has run, however the module was looked up.
See docs/how-it-works.md.
"""

import _thread
import sys

PACKAGE = "_hyperloom_eval_probe"


class EmbeddedRuntime:
    """A meta-path finder and loader for ``PACKAGE`` and its modules, from source text."""

    def __init__(self, sources: dict, origin: str) -> None:
        self.sources = sources
        self.origin = origin

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        package, _, name = fullname.partition(".")
        if package != PACKAGE or (name and name not in self.sources):
            return None
        from importlib.machinery import ModuleSpec

        inner = name + "."  # a folder of the runtime ("core") is a package of its own
        is_package = not name or any(key.startswith(inner) for key in self.sources)
        return ModuleSpec(fullname, self, origin=self.origin, is_package=is_package)

    def create_module(self, spec: object) -> None:
        return None

    def exec_module(self, module: object) -> None:
        name = module.__name__.partition(".")[2]
        if name:
            where = f"{self.origin} (lm-eval-probe {name})"
            exec(compile(self.sources[name], where, "exec"), module.__dict__)


def unpack(packed: str) -> dict:
    """The module sources, {name: source}, from the packed text the injected file holds."""
    import base64
    import json
    import zlib

    return json.loads(zlib.decompress(base64.b85decode(packed)).decode("utf-8"))


def load_runtime(packed: str, origin: str) -> object:
    """Import the runtime's ``install`` module from ``packed``; None (and one line) on failure."""
    try:
        if not any(isinstance(f, EmbeddedRuntime) for f in sys.meta_path):
            sys.meta_path.append(EmbeddedRuntime(unpack(packed), origin))
        __import__(f"{PACKAGE}.install")
        return sys.modules[f"{PACKAGE}.install"]
    except Exception as error:
        sys.stderr.write(f"[lm-eval-probe] the runtime failed to load ({error!r}); lm-eval runs unprobed\n")
        return None


class WaitForLmEval:
    """A meta-path finder that hands each run of a target module over to the runtime."""

    def __init__(self, packed: str, origin: str, targets: tuple) -> None:
        self.packed = packed
        self.origin = origin
        self.targets = targets
        self.asking: set = set()  # (thread, name) being looked up past this finder

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        asking = (_thread.get_ident(), fullname)
        if fullname not in self.targets or asking in self.asking:
            return None  # asked again while the runtime asks the finders after it: theirs to answer
        self.asking.add(asking)
        try:
            runtime = load_runtime(self.packed, self.origin)
            return runtime.installing_spec(fullname, path, target) if runtime else None
        finally:
            self.asking.discard(asking)


def boot(packed: str, origin: str, chain_source: str = "", targets: tuple = ()) -> None:
    """Arrange for the runtime to install on ``targets`` (module names); acts at most once per process.

    ``chain_source`` comes only from a probe-made sitecustomize.py, which also runs the file it shadows.
    The once-flag is set before chaining, so a probe block in the chained file stands down.
    See docs/how-it-works.md.
    """
    booted = getattr(sys, "_lm_eval_probe_booted", False)
    sys._lm_eval_probe_booted = True
    if chain_source:  # even when standing down: the file it shadows must still run
        chain = {"__name__": "_hyperloom_eval_probe_chain"}
        exec(compile(chain_source, f"{origin} (lm-eval-probe chain)", "exec"), chain)
        chain["chain_next_sitecustomize"](origin)
    if booted:
        return  # installed twice (appended twice, chained, or loaded two ways): act once
    sys.meta_path.insert(0, WaitForLmEval(packed, origin, targets))
    imported = [name for name in targets if name in sys.modules]
    runtime = load_runtime(packed, origin) if imported else None
    for name in imported:
        if runtime:
            runtime.install_module(sys.modules[name])
