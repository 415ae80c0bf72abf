"""The integration on lm-eval's API models (``TemplateAPI``): served models over HTTP."""
