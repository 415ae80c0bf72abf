"""The demo, and what tests and benchmarks share with it.

That is a simulated OpenAI-compatible server, a local task lm-eval runs offline, and a server's own
counters.
"""
