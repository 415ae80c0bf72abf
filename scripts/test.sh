#!/usr/bin/env bash
# Set up everything, then run the whole test suite: lint; every test that touches lm-eval (all
# but the vLLM and the release_independent ones) against InferenceX's lm-eval (b315ef3), installed
# the way InferenceX installs it, InferenceX's flow first; against the 0.4.9.2 release, what differs
# there (see below); the same as b315ef3's but InferenceX's flow against 0.4.12; then every test against lm-eval 0.4.13 (the end-to-end tests on
# real vLLM, served and in-process, included). The tests on lm-eval's Hugging Face backend (marker
# hf) need torch: they run against the 0.4.9.2 release, whose environment has it.
# Extra arguments go to every pytest run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh all

echo "== lint (ruff)"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

inferencex_tests() {
    # InferenceX's flow first (the patched benchmark_lib.sh, run_lm_eval, staging, read), then
    # every other test that touches lm-eval.
    local py=.venv-inferencex/bin/python marks="not vllm and not release_independent"
    # Exit status 5: the extra arguments selected none of the flow's tests.
    "$py" -m pytest -m "$marks" -p no:cacheprovider tests/test_inferencex_flow.py "$@" || [ $? -eq 5 ]
    # Not the Hugging Face backend's tests (marker hf): InferenceX evaluates over HTTP only.
    "$py" -m pytest -m "$marks and not inferencex and not hf" -p no:cacheprovider "$@"
}
echo "== tests against InferenceX's lm-eval (b315ef3) over lm-eval 0.4.13's dependencies, as InferenceX installs it"
inferencex_tests "$@"

# InferenceX's flow is left out below: InferenceX installs b315ef3, or 0.4.13 when that fails.
# Its API model, cache and vLLM modules are b315ef3's byte for byte, so this pass runs only what
# differs there: the command line and start of an evaluation (legacy parser, eager registry, the
# evaluator's entry), results saving over its older dependencies, and the Hugging Face backend
# (the one environment with torch and transformers<5). CI time: see the README.
echo "== tests against the 0.4.9.2 release (the legacy command line, the eager model registry, --model hf)"
.venv-lm-eval-0.4.9.2/bin/python -m pytest -m "not vllm and not release_independent and not inferencex" \
    -p no:cacheprovider tests/test_lm_eval_cli.py tests/test_install_run.py tests/test_scope.py \
    tests/test_task_evidence.py tests/test_hf.py tests/test_hf_answers.py tests/test_hf_rows.py tests/test_hf_order.py "$@" || [ $? -eq 5 ]

# Not the whole lm-eval command lines of streamed runs (marker slow): the in-process streamed
# tests cover 0.4.12's parser and placeholder; b315ef3 and 0.4.13 run those command lines (CI time).
echo "== tests against lm-eval 0.4.12 (a static parse_generations, and null content as a cached placeholder)"
.venv-lm-eval-0.4.12/bin/python -m pytest -m "not vllm and not release_independent and not inferencex and not hf and not slow" \
    -p no:cacheprovider "$@"

echo "== tests against lm-eval 0.4.13, with the end-to-end tests on real vLLM"
LM_EVAL_PROBE_VLLM_PYTHON="$PWD/.venv-vllm/bin/python" .venv/bin/python -m pytest -m "not hf" -p no:cacheprovider "$@"
