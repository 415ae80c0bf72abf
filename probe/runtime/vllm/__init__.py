"""The integration on lm-eval's in-process vLLM backend (``--model vllm``), its engine's slow
start, and its data-parallel Ray replicas."""
