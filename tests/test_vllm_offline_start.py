"""lm-eval's in-process vLLM backend (``--model vllm``), CPU build, tiny Llamas: what reaches the
engine. The slow start per group, a stopping model's answers, an engine the probe cannot hook,
the stub on lm-eval's vLLM module, and the copy of the sampling parameters the probe watches
through (the engine's partial outputs and the loop detector's trip: tests/test_vllm_offline.py).
Runs as tests/support/offline.py describes; deselect with ``-m "not vllm"``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.offline import DOCS, MIN_SAMPLES, evaluate, tiny_llamas
from support.procs import probe_site
from support.vllm import answers, vllm_python

from probe.demo.localtask import SECOND_TASK, LocalTask, offline_env, write_task
from probe.runtime.core import contract

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.vllm
SHORT = 128  # the budget of runs whose promise does not rest on its size (CI time)


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> LocalTask:
    return write_task(tmp_path_factory.mktemp("task"), DOCS)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llamas(tmp_path_factory)


def test_each_group_sends_the_engine_min_samples_before_any_evidence_across_tasks_and_chunks(models, tmp_path) -> None:
    # An engine as wide as the run (48), two tasks with different stop sequences (two groups),
    # each in chunks of 10 (--batch_size 10: one LLM.generate call per chunk), the loop detector
    # off (only endings count). Without a slow start vLLM would run every request to the cap
    # before the MIN_SAMPLES observations the cap rule needs. With it, each group's budget is
    # its own and spans its chunks: each reaches the engine with exactly MIN_SAMPLES requests,
    # all at the cap (its second chunk held back until the first's evidence came), and the trip
    # answers the rest of it blank before they reach the engine (a budget per call would have
    # let a chunk's 10 be sent whole after the first chunk's 10, or one group's 16 be spread
    # over two). One run for both promises: an engine start is most of a run here (CI time), and
    # generations of SHORT tokens, judged with MIN_MAX_TOKENS lowered, keep its four waves short.
    first = write_task(tmp_path / "tasks", 24)
    second = write_task(tmp_path / "tasks", 24, task=SECOND_TASK)
    knobs = {contract.ENV_STREAM: "off", contract.ENV_MIN_MAX_TOKENS: "0"}
    run, probed = evaluate(
        models / "never_stop", first, tmp_path / "probed", True, max_num_seqs=48, batch_size="10", also=(second,),
        max_tokens=SHORT, **knobs,
    )  # fmt: skip
    assert run.stderr.count("[lm-eval-probe] tripped:") == 2
    assert probed["generation_tokens"] == 2 * MIN_SAMPLES * SHORT  # vLLM's own count
    assert probed["finished_length"] == 2 * MIN_SAMPLES
    final = json.loads((tmp_path / "probed" / contract.SIDECAR_NAME).read_text())["final"]
    assert final["cancelled_in_flight"] == 0 and final["short_circuited_requests"] == 2 * (24 - MIN_SAMPLES)
    for task in (first, second):
        given = sorted(answers(tmp_path / "probed", task.name))
        assert given == [""] * (24 - MIN_SAMPLES) + ["a" * SHORT] * MIN_SAMPLES


def test_stopping_model_answers_as_unprobed_and_nothing_trips(models, task, tmp_path) -> None:
    # Unprobed, the stopping model answers every prompt with its one token, " 7\n\n", which ends
    # at lm-eval's stop sequence: " 7", one token each by vLLM's own count (as the replicas'
    # run and the served one give it; tests/test_tiny_llama.py checks the model).
    run, probed = evaluate(models / "stops", task, tmp_path / "probed", probed=True)
    assert f"the probe did not trip: 0 of {DOCS} generations observed were cut off" in run.stderr
    assert not (tmp_path / "probed" / contract.SIDECAR_NAME).exists()
    assert answers(tmp_path / "probed") == [" 7"] * DOCS
    assert probed["generation_tokens"] == DOCS


def test_an_engine_that_cannot_be_hooked_runs_unprobed_with_one_message(models, tmp_path) -> None:
    # The hook point really absent: an engine without abort_request (an offline run never
    # calls it unless a request fails). This sitecustomize.py runs after the probe's own, in
    # every process: eval-probe's own has no vLLM.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "try:\n    import vllm\nexcept ImportError:\n    pass\nelse:\n    del vllm.LLMEngine.abort_request\n"
    )
    # MIN_SAMPLES documents at the cap: enough for a trip, had the probe been watching (with
    # MIN_MAX_TOKENS lowered for the SHORT budget).
    small = write_task(tmp_path / "task", MIN_SAMPLES)
    knobs = {contract.ENV_MIN_MAX_TOKENS: "0"}
    run, counters = evaluate(
        models / "never_stop", small, tmp_path / "out", probed=True, site=site, max_tokens=SHORT, **knobs
    )
    # Counted in the whole of stderr: lm-eval's progress bar shares the probe's lines.
    assert run.stderr.count("[lm-eval-probe] could not hook vLLM's engine") == 1
    assert "has no abort_request')); lm-eval's vLLM backend runs unprobed" in run.stderr
    assert "[lm-eval-probe] internal error" not in run.stderr
    # Unprobed: every generation ran to the cap, and nothing was cut short or written.
    assert counters["generation_tokens"] == MIN_SAMPLES * SHORT
    assert not (tmp_path / "out" / contract.SIDECAR_NAME).exists()
    assert answers(tmp_path / "out") == ["a" * SHORT] * MIN_SAMPLES


def test_the_stub_installs_on_lm_evals_vllm_module_alone(tmp_path) -> None:
    # lm-eval 0.4.13 imports model modules lazily: under --model vllm, the API module never is.
    check = (
        "import sys, lm_eval.models.vllm_causallms as m\n"
        "print(hasattr(m.VLLM._model_generate, '__lm_eval_probe__'), 'lm_eval.models.api_models' in sys.modules)"
    )
    env = offline_env(probe_site(tmp_path / "site"), RESULT_DIR=str(tmp_path))
    run = subprocess.run([vllm_python(), "-c", check], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout == "True False\n"


# Run in the vLLM environment on vLLM's own SamplingParams: the promise is about its fields.
_WATCHED_COPY_CHECK = """
import msgspec
from vllm import SamplingParams
from vllm.sampling_params import RequestOutputKind
from probe.runtime.vllm.vllm_partial import STREAM_INTERVAL, watched_params

for given in [dict(max_tokens=64, stop=["\\n\\n", "Question:"]),
              dict(max_tokens=8, temperature=0.7, logprobs=2, seed=3, stream_interval=64)]:
    params = SamplingParams(**given)
    params.output_kind = RequestOutputKind.FINAL_ONLY  # as LLM.generate sets it
    before = msgspec.structs.asdict(params)
    copy, why = watched_params(params)
    assert why is None and copy is not params and msgspec.structs.asdict(params) == before
    after = msgspec.structs.asdict(copy)
    assert {k for k, v in after.items() if before[k] != v} <= {"output_kind", "stream_interval"}
    assert copy.output_kind is RequestOutputKind.CUMULATIVE
    assert copy.stream_interval == max(STREAM_INTERVAL, given.get("stream_interval", 1))
two = SamplingParams(n=2, temperature=1)
two.output_kind = RequestOutputKind.FINAL_ONLY
assert watched_params(two) == (two, "n=2 choices per prompt")
other = SamplingParams()  # cumulative already: not LLM.generate's, left alone
assert watched_params(other)[0] is other
print("ok")
"""


def test_the_watched_copy_differs_only_in_what_the_engine_reports(tmp_path) -> None:
    env = offline_env(None, PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [vllm_python(), "-c", _WATCHED_COPY_CHECK], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.endswith("ok\n")
