"""The injected runtime: the code that runs inside lm-eval, in other people's Python.

Every module here is embedded, as source, into a ``sitecustomize.py`` (built by ``probe/inject.py``).
It runs where lm-eval-probe is not installed.
So a module imports only the standard library, ``lm_eval``, ``vllm`` and its siblings.
The folders are layered by role: ``core``, ``hooking``, ``scope``, ``inprocess``, then the integrations.
``tests/test_runtime_guard.py`` and ``tests/test_runtime_layout.py`` enforce both rules.
See docs/layout.md.
"""
