"""What lm-eval's in-process backends (vLLM, Hugging Face) share: the request order with a
sample first, and what the sidecar says of an in-process model."""
