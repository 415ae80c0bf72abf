"""Putting the probe where lm-eval runs: InferenceX's benchmark_lib.sh, a site dir, a command."""
