#!/usr/bin/env bash
# Set up everything, then run the whole test suite: lint; every test that touches lm-eval (all
# but the vLLM and the release_independent ones) against InferenceX's lm-eval (b315ef3), installed
# the way InferenceX installs it, InferenceX's flow first; against the 0.4.9.2 release, what differs
# there (see below); against 0.4.12, what differs there (its API model, its Hugging Face module);
# then every test against lm-eval 0.4.13 (the end-to-end tests on real vLLM, served and
# in-process, included). The tests on lm-eval's Hugging Face backend (marker hf) need torch: they
# run against the 0.4.9.2 and 0.4.12 releases, whose environments have it, and against 0.4.13 in
# the vLLM environment (0.4.13 with torch). b315ef3's Hugging Face module is 0.4.9.2's byte for byte.
#
# One pass after another (side by side on 2 cores, the torch and vLLM passes ran 2.5-3x slower:
# their threads spin against each other). Within a pass, tests run in two pytest-xdist workers, a
# test file to each (its module fixtures stay in one worker), each worker's torch and vLLM on a
# core of its own (tests/conftest.py): the tests spend much of their time in lm-eval's
# single-threaded start-up and in simulated servers. Two workers took the 0.4.13 pass from 527 s
# to 248 s and the vLLM pass from 870 s to 607 s. lm-eval's task index (7-15 s of every run) comes
# from a memo in every pass but InferenceX's flow (see below).
# Each pass's output also goes to .cache/test-logs/PASS.log, with each pytest run's 10 slowest
# tests, and a summary at the end gives each pass's result and seconds.
# Extra arguments go to every pytest run; a pass they leave without tests (pytest's status 5) then
# counts as passed, while without them a pass that selects nothing fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh all

echo "== lint (ruff, and the documentation site built strictly: a broken link fails)"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# Not --quiet: it hides the warnings that --strict counts, and a broken link would then pass.
site_dir="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site_dir"
rm -rf "$site_dir"

# lm-eval reads its ~14,000 built-in task files to index them at the start of every run (7-15 s of a
# core, most of a whole run here, and nothing the probe touches). Each test environment gets a .pth
# line that keeps what that indexing read in a memo (tests/support/task_index_memo.py) while the
# variable below names its directory: every pass but InferenceX's flow, which runs as InferenceX
# runs it. The memo starts empty: the first runs of each environment index lm-eval's files for real.
memo_pth=lm_eval_probe_test_task_index_memo.pth
export LM_EVAL_PROBE_TASK_INDEX_MEMO="$PWD/.cache/task-index-memo"
rm -rf "$LM_EVAL_PROBE_TASK_INDEX_MEMO"
for venv in .venv .venv-inferencex .venv-lm-eval-0.4.9.2 .venv-lm-eval-0.4.12 .venv-vllm; do
    site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    PYTHONPATH=tests "$venv/bin/python" -c 'import sys; from support.task_index_memo import pth_line
print(pth_line(sys.argv[1]), end="")' "$PWD/tests/support/task_index_memo.py" > "$site/$memo_pth"
    "$venv/bin/python" -c 'import sys; assert any(type(f).__name__ == "TaskIndexMemo" for f in sys.meta_path)' \
        || { echo "test: the task index memo did not start in $venv (from $site/$memo_pth)" >&2; exit 1; }
done
setup_seconds="$SECONDS"
# The environments only the tests use compile what a run imports when it first imports it
# (scripts/setup.sh): runs must be able to write it. InferenceX's flow sets this again itself.
unset PYTHONDONTWRITEBYTECODE

extra=("$@")
workers=(-n 2 --dist loadfile)  # pytest-xdist: two workers, each on a core of its own (tests/conftest.py)
# The Hugging Face tests test by test: five whole lm-eval runs of test_hf.py would keep one worker
# busy for three minutes while the other idles; each worker builds the module's models itself.
hf_workers=(-n 2 --dist load)
pytest_in() {  # pytest_in VENV PYTEST-ARG...: one pytest run in VENV, with the extra arguments
    local venv="$1"
    shift
    local status=0
    "$venv/bin/python" -m pytest -p no:cacheprovider --durations=10 "$@" "${extra[@]}" || status=$?
    if [ "$status" -eq 5 ] && [ "${#extra[@]}" -gt 0 ]; then
        return 0
    fi
    return "$status"
}

# Each pass: what it tests, then its pytest runs.
title_inferencex_flow="InferenceX's flow (the patched benchmark_lib.sh, run_lm_eval, staging, read) against its lm-eval (b315ef3)"
pass_inferencex_flow() {
    local -x LM_EVAL_PROBE_TASK_INDEX_MEMO=""  # lm-eval indexes its task files, as in InferenceX
    pytest_in .venv-inferencex -n 2 --dist worksteal -m "not vllm and not release_independent" tests/test_inferencex_flow.py
}
title_inferencex="every other test that touches lm-eval against InferenceX's lm-eval (b315ef3) over lm-eval 0.4.13's dependencies, as InferenceX installs it"
pass_inferencex() {
    # Not the Hugging Face backend's tests (marker hf): InferenceX evaluates over HTTP only.
    pytest_in .venv-inferencex "${workers[@]}" -m "not vllm and not release_independent and not inferencex and not hf"
}
# InferenceX's flow is left out below: InferenceX installs b315ef3, or 0.4.13 when that fails.
# 0.4.9.2's API model, cache and vLLM modules are b315ef3's byte for byte, so this pass runs only
# what differs there: the tests marked entry (the command line and start of an evaluation: legacy
# parser, eager registry, the evaluator's entry; results saving over its older dependencies), and
# the Hugging Face module (b315ef3's too; the one environment with transformers<5) in-process. Not
# the rest of those files (the probe's install, report and process handling over the same API
# model: about 55% of this pass's time, each lm-eval start here 10-14 s of imports; they run
# against b315ef3 and 0.4.13), nor test_hf.py's whole command lines (nine lm-eval runs, about
# 150 s of this pass): their command line and evaluator are the ones this pass runs with the API
# model, their Hugging Face module the one the in-process tests drive here, and they run whole
# against 0.4.13 (pass 0413_hf).
title_0492="against the 0.4.9.2 release (the legacy command line, the eager model registry, HFLM in-process)"
pass_0492() {
    # One run, test by test, stealing: by file, one worker got about twice the other's share,
    # and a second run for the Hugging Face files started this release again (10 s).
    pytest_in .venv-lm-eval-0.4.9.2 -n 2 --dist worksteal -m "(entry or hf) and not vllm and not release_independent and not inferencex" \
        tests/test_lm_eval_cli.py tests/test_install_run.py tests/test_scope.py tests/test_task_evidence.py \
        tests/test_hf_answers.py tests/test_hf_rows.py tests/test_hf_order.py
}
# What differs in 0.4.12 is its API model: a static parse_generations, and null content as a cached
# placeholder. So this pass runs the tests that drive lm-eval's API models in-process (generation,
# caching, streaming and when, the gate, the order, the loop detector); the command line and the start of
# an evaluation run against b315ef3 and 0.4.13 on either side of it (CI time: see docs/testing.md).
# Not the whole lm-eval command lines of streamed runs (marker slow) either.
# Its Hugging Face module differs from 0.4.9.2's, and from 0.4.13's only in how it finds the
# model's maximum length (and in its GPU memory arguments), over a newer transformers: the
# Hugging Face tests that drive HFLM in-process run here; not test_hf.py's whole command lines,
# whose command line, evaluator and batching (lm_eval/models/utils.py) are 0.4.13's but for log
# formatting and that length.
title_0412="against lm-eval 0.4.12 (a static parse_generations, null content as a cached placeholder, HFLM in-process)"
pass_0412() {
    local status=0
    pytest_in .venv-lm-eval-0.4.12 "${workers[@]}" -m "not vllm and not release_independent and not inferencex and not hf and not slow" \
        tests/test_probe_lm.py tests/test_gate_lm.py tests/test_stream_lm.py \
        tests/test_order.py tests/test_detector_probe.py tests/test_streaming.py tests/test_filing.py || status=$?
    pytest_in .venv-lm-eval-0.4.12 "${hf_workers[@]}" -m "hf and not vllm and not release_independent" \
        tests/test_hf_answers.py tests/test_hf_rows.py tests/test_hf_order.py || status=$?
    return "$status"
}
title_0413="every test but the vLLM ones against lm-eval 0.4.13"
pass_0413() {
    pytest_in .venv "${workers[@]}" -m "not vllm and not hf"
}
# lm-eval 0.4.13's Hugging Face backend, in the environment that has 0.4.13 and torch.
title_0413_hf="lm-eval 0.4.13's Hugging Face backend (--model hf), in the vLLM environment (0.4.13 with torch)"
pass_0413_hf() {
    pytest_in .venv-vllm "${hf_workers[@]}" -m "hf and not vllm"
}
title_0413_vllm="the end-to-end tests on real vLLM (served, in-process, replicas over Ray) with lm-eval 0.4.13"
# Two lanes side by side, a pytest run each, each on a core of its own (as tests/conftest.py holds
# an xdist worker's), sharing the tiny Llamas they build: the files' module fixtures (vLLM
# servers, a Ray cluster) and the session's echo server start once, and the lanes take about as
# long. pytest-xdist's --dist loadfile left one worker with test_vllm_offline.py (836 s) while the
# other's files took 700; its --dist loadgroup does not group under pytest 9.2.
# Lane a: the files below (the in-process engine's partial outputs, then the replicas); lane b:
# every other vLLM test (test_stream_vllm.py, test_vllm_e2e.py, test_vllm_offline_start.py: one
# echo server for the first two, whose prompts make it stop or loop), so that no new file is left
# out. Each lane is about 450 s of engine start-ups (about 50 s an engine alone, 100 s beside the
# other lane), so the runs whose promise does not rest on a long generation make short ones.
# The tests marked alone run last in their lane, and in lane b (where they belong) only once lane
# a is done: closing a stream mid-generation needs the client to read its first text while vLLM is
# still generating, and with a second engine spinning on the other core the client read it only
# once vLLM had made every token (4 of 6 runs side by side, at 1,900 and at 8,000 tokens; 0 of 2
# alone). Lane b keeps its echo server for them (run by themselves after both lanes, they started
# it again: about 60 s).
lane_a=(tests/test_vllm_offline.py tests/test_vllm_replicas.py)
pass_0413_vllm() {
    local status=0 other=0 lane_b cores
    local -x LM_EVAL_PROBE_VLLM_PYTHON="$PWD/.venv-vllm/bin/python" LM_EVAL_PROBE_TINY_LLAMAS
    read -r -a cores <<< "$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
    LM_EVAL_PROBE_TINY_LLAMAS="$(mktemp -d)"
    lane_b="$(mktemp)"
    local quiet="$LM_EVAL_PROBE_TINY_LLAMAS/lane-a-done"
    LM_EVAL_PROBE_QUIET_AFTER="$quiet" OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND="${cores[1]:-${cores[0]}}" \
        pytest_in .venv -m "vllm and not hf" "${lane_a[@]/#/--ignore=}" >"$lane_b" 2>&1 &
    local b=$!
    echo "-- lane a: ${lane_a[*]} (lane b, every other vLLM test, is shown when it is done)"
    OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND="${cores[0]}" \
        pytest_in .venv -m "vllm and not hf" "${lane_a[@]}" || status=$?
    touch "$quiet"
    wait "$b" || other=$?
    echo "-- lane b: every other vLLM test"
    cat "$lane_b"
    rm -f "$lane_b"
    [ "$other" = 0 ] || status="$other"
    rm -rf "$LM_EVAL_PROBE_TINY_LLAMAS"
    return "$status"
}
passes=(inferencex_flow inferencex 0492 0412 0413 0413_hf 0413_vllm)

logs=.cache/test-logs
rm -rf "$logs"
mkdir -p "$logs"
summary=("   setup and lint ($setup_seconds s)") failed=0
for name in "${passes[@]}"; do
    title="title_$name"
    echo "== $name: ${!title}" | tee "$logs/$name.log"
    status=0 start="$SECONDS"
    "pass_$name" 2>&1 | tee -a "$logs/$name.log" || status=$?
    if [ "$status" = 0 ]; then
        summary+=("   passed  $name ($((SECONDS - start)) s)")
    else
        summary+=("   FAILED  $name ($((SECONDS - start)) s, pytest status $status; its log: $logs/$name.log)")
        failed=1
    fi
done

echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
