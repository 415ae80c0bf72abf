"""The integration on lm-eval's Hugging Face backend (``--model hf``)."""
