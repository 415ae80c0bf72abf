"""Start-up stub: runs in every Python process that has the probe's sitecustomize.py.

Every such process compiles it from source (InferenceX sets PYTHONDONTWRITEBYTECODE=1),
and compiling costs about 0.3 ms per kilobyte of code here, so it stays this small. It
only registers a finder that waits for ``lm_eval.models.api_models``; the body
(``probe/body.py``, handed over as source text) is compiled then, and installs itself
right after that module has run.
"""

import sys

BODY_MODULE = "_hyperloom_eval_probe"
TARGET = "lm_eval.models.api_models"


def load_body(source: str, origin: str) -> object:
    """Compile the body into a module of its own (registered, so its types pickle)."""
    try:
        module = type(sys)(BODY_MODULE)
        module.__file__ = origin
        sys.modules[BODY_MODULE] = module
        exec(compile(source, f"{origin} (lm-eval-probe body)", "exec"), module.__dict__)
        return module
    except Exception as error:
        sys.stderr.write(f"[lm-eval-probe] body failed to load ({error!r}); lm-eval runs unprobed\n")
        return None


class WaitForLmEval:
    """A meta-path finder that hands the import of TARGET over to the body, once."""

    def __init__(self, source: str, origin: str) -> None:
        self.source = source
        self.origin = origin

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> object:
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        body = load_body(self.source, self.origin)
        return body.installing_spec(fullname, path, target) if body else None


def boot(body_source: str, origin: str, chain_source: str = "") -> None:
    """Arrange for the body to install; acts at most once per process.

    ``chain_source`` (``probe/chain.py``) is given only by a sitecustomize.py the probe
    created itself, which must also run the one it shadows.
    """
    if chain_source:
        chain = {"__name__": "_hyperloom_eval_probe_chain"}
        exec(compile(chain_source, f"{origin} (lm-eval-probe chain)", "exec"), chain)
        chain["chain_next_sitecustomize"](origin)
    if getattr(sys, "_lm_eval_probe_booted", False):
        return  # installed twice (appended twice, or loaded two ways): act once
    sys._lm_eval_probe_booted = True
    if TARGET not in sys.modules:
        sys.meta_path.insert(0, WaitForLmEval(body_source, origin))
        return
    body = load_body(body_source, origin)
    if body:
        body.install(sys.modules[TARGET])
