#!/usr/bin/env bash
# Set up everything, then run the whole test suite: lint, every test against lm-eval
# 0.4.13 (the end-to-end tests on real vLLM, served and in-process, included), and every
# test that touches lm-eval (all but the vLLM and the release_independent ones) against
# lm-eval 0.4.9.2 and 0.4.12; the tests on lm-eval's Hugging Face backend (marker hf) run
# against 0.4.9.2 only, the one environment with torch. Extra arguments go to every pytest run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh all

echo "== lint (ruff)"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

echo "== tests against lm-eval 0.4.9.2 (the release InferenceX pins)"
.venv-lm-eval-0.4.9.2/bin/python -m pytest -m "not vllm and not release_independent" -p no:cacheprovider "$@"

echo "== tests against lm-eval 0.4.12 (null content becomes a cached placeholder)"
.venv-lm-eval-0.4.12/bin/python -m pytest -m "not vllm and not release_independent and not hf" -p no:cacheprovider "$@"

echo "== tests against lm-eval 0.4.13, with the end-to-end tests on real vLLM"
LM_EVAL_PROBE_VLLM_PYTHON="$PWD/.venv-vllm/bin/python" .venv/bin/python -m pytest -m "not hf" -p no:cacheprovider "$@"
