"""Start-up stub: runs in every Python process that has the probe's sitecustomize.py.

The injected text holds it as real code, the body of a function, so Python keeps it compiled
with the file; where it keeps no bytecode (InferenceX), every process compiles it, so it stays tiny.
It only registers a finder that waits for the modules the integrations hook.
The runtime, and the finder that serves it, travel packed and are compiled when the first of
them is imported.
It then installs right after that module has run, however the module was looked up.
See docs/how-it-works.md.
"""

import _thread
import os
import sys

PACKAGE = "_hyperloom_eval_probe"
LOADER = "hooking.embedded"  # the packed module that serves the others (``EmbeddedRuntime``)


def unpack(packed: str) -> dict:
    """The module sources, {name: source}, from the packed text the injected file holds."""
    import base64
    import json
    import zlib

    return json.loads(zlib.decompress(base64.b85decode(packed)).decode("utf-8"))


def load_runtime(packed: str, origin: str) -> object:
    """Import the runtime's ``install`` module from ``packed``; None (and one line) on failure."""
    try:
        if not any(getattr(f, "serves", None) == PACKAGE for f in sys.meta_path):
            sources = unpack(packed)
            loader = {"__name__": f"{PACKAGE}_loader"}
            exec(compile(sources[LOADER], f"{origin} (lm-eval-probe {LOADER})", "exec"), loader)
            sys.meta_path.append(loader["EmbeddedRuntime"](PACKAGE, sources, origin))
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


def shadows_another(origin: str) -> bool:
    """Whether a sitecustomize besides ``origin`` may be imported: only then is the chain compiled."""
    try:
        from importlib.machinery import BuiltinImporter, FrozenImporter, PathFinder

        here = os.path.dirname(os.path.abspath(origin))
        others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
        if PathFinder.find_spec("sitecustomize", others) is not None:
            return True
        finders = [f for f in sys.meta_path if f not in (BuiltinImporter, FrozenImporter, PathFinder)]
        return any(f.find_spec("sitecustomize", None, None) is not None for f in finders)  # an editable install's
    except Exception:
        return True  # the chain looks again, and says what failed


def boot(packed: str, origin: str, chain_source: str = "", targets: tuple = ()) -> None:
    """Arrange for the runtime to install on ``targets`` (module names); acts at most once per process.

    ``chain_source`` comes only from a probe-made sitecustomize.py, which also runs the file it shadows.
    The once-flag is set before chaining, so a probe block in the chained file stands down.
    See docs/how-it-works.md.
    """
    booted = getattr(sys, "_lm_eval_probe_booted", False)
    sys._lm_eval_probe_booted = True
    if chain_source and shadows_another(origin):  # even when standing down: it must still run
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
