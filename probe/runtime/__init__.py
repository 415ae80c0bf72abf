"""The injected runtime: the code that runs inside lm-eval, in other people's Python.

Every module here is embedded, as source, into a ``sitecustomize.py`` (``probe/inject.py``
builds that text from these files) and runs where lm-eval-probe is **not installed**. A module
here imports only the standard library, ``lm_eval`` and ``vllm`` (inside the glue that needs
them), and its siblings by absolute name; ``tests/test_runtime_guard.py`` enforces this.

The folders, lowest layer first (``tests/test_runtime_layout.py`` enforces the order):

- ``core``: pure logic: the contract, the trip rule, evidence, the loop detector, the sidecar.
- ``hooking``: the start-up stub, reversible patching, the shape of an integration.
- ``scope``: the per-evaluation state and the decision to trip.
- ``inprocess``: what the in-process backends share.
- ``evaluator``, ``api_models``, ``vllm``, ``huggingface``: one folder per integration.
- ``registry`` lists the integrations; ``install`` puts them in place and takes them out.
"""
