"""The integration on lm-eval's evaluator: one scope per evaluation, the evidence in its
results file, the blank answers marked in its samples and kept out of its caches."""
