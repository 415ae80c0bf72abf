"""The injected runtime: the code that runs inside lm-eval, in other people's Python.

Every module here is embedded, as source, into a ``sitecustomize.py`` (``probe/inject.py``
builds that text from these files) and runs in environments where lm-eval-probe is **not
installed**. So a module here may import only:

- the standard library;
- ``lm_eval`` and ``vllm`` (the programs it hooks into), only inside the glue that needs them;
- its siblings, by absolute name (``from probe.runtime.contract import ...``), which the
  injected text serves from the embedded sources under a private package name.

No relative imports, and nothing from ``probe.reader``, ``probe.demo``, ``patcher`` or any
third-party package. ``tests/test_runtime_guard.py`` enforces this rule.

Pure logic (``contract``, ``evidence``, ``rule``, ``sidecar``) is kept apart from the glue
that touches lm-eval (``api``, ``caches``, ``install``) so it can be tested exhaustively.
"""
