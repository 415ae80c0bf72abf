"""End to end on lm-eval's in-process vLLM backend (``--model vllm``), CPU build, tiny Llamas.

Each run is ``python -m lm_eval --model vllm`` in the vLLM environment (named by
LM_EVAL_PROBE_VLLM_PYTHON), through ``eval-probe run`` when probed, with vLLM's own counters
written at its end (scripts/lm_eval_counted.py). Deselect with ``-m "not vllm"``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.procs import PYTHON, probe_site
from support.resultfiles import written_by_lm_eval
from support.vllm import SCRIPTS, answers, tiny_llama, vllm_python

from probe.demo.localtask import SECOND_TASK, LocalTask, offline_env, write_task
from probe.demo.servercounters import parse_vllm_metrics
from probe.runtime import contract
from probe.runtime.contract import EVIDENCE_KEY

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.vllm
MAX_TOKENS = 1024
DOCS = 48
MAX_NUM_SEQS = 8  # six waves of generations: the trip comes after two
MIN_SAMPLES = contract.Settings().min_samples


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> LocalTask:
    return write_task(tmp_path_factory.mktemp("task"), DOCS)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    for variant in ("never_stop", "stops", "babble"):
        tiny_llama(vllm_python(), root / variant, variant)
    return root


def evaluate(
    model: Path,
    task: LocalTask,
    output: Path,
    probed: bool,
    site: Path | None = None,
    gen_kwargs: str = "",
    max_num_seqs: int = MAX_NUM_SEQS,
    batch_size: str = "auto",
    also: tuple[LocalTask, ...] = (),
    **knobs: str,
) -> tuple[subprocess.CompletedProcess, dict[str, float]]:
    """One lm-eval run on the in-process vLLM backend; returns it and vLLM's own counters.

    ``site``: a directory put on PYTHONPATH (after the probe's own, which runs it too);
    ``gen_kwargs``: added to lm-eval's ``--gen_kwargs``; ``also``: more tasks in the run;
    ``knobs``: the probe's variables.
    """
    metrics = output.with_suffix(".metrics.txt")
    arguments = task.lm_eval_vllm_arguments(
        model, output, MAX_TOKENS, max_num_seqs, "--log_samples", gen_kwargs=gen_kwargs, batch_size=batch_size,
        also=also,
    )  # fmt: skip
    lm_eval = [vllm_python(), str(SCRIPTS / "lm_eval_counted.py"), str(metrics), "--", *arguments]
    command = [PYTHON, "-m", "probe", "run", "--result-dir", str(output), "--", *lm_eval] if probed else lm_eval
    env = offline_env(None, VLLM_CPU_KVCACHE_SPACE="1", **knobs)
    if site is not None:
        env["PYTHONPATH"] = str(site)
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run, parse_vllm_metrics(metrics.read_text())


@pytest.fixture(scope="module")
def unprobed_never_stop(models, task, tmp_path_factory) -> tuple[Path, dict[str, float]]:
    """The never-stopping model's unprobed run, shared: its output directory and counters."""
    output = tmp_path_factory.mktemp("unprobed") / "plain"
    _, counters = evaluate(models / "never_stop", task, output, probed=False)
    return output, counters


def test_never_stopping_model_trips_inside_the_engine_and_saves_tokens(
    models, task, unprobed_never_stop, tmp_path
) -> None:
    _, unprobed = unprobed_never_stop
    run, probed = evaluate(models / "never_stop", task, tmp_path / "probed", probed=True)
    assert unprobed["generation_tokens"] == DOCS * MAX_TOKENS  # vLLM's own count: all ran to the cap
    assert "summary: TRIPPED (non_terminating)" in run.stderr
    sidecar = json.loads((tmp_path / "probed" / contract.SIDECAR_NAME).read_text())
    # The loop detector read the partial outputs: the trip came from its flags, before the
    # MIN_SAMPLES generations the cap rule waits for had all run to the cap. With 8 running
    # at once, the first wave's flags are not enough; the second wave's complete them.
    assert sidecar["verdict"]["cause"] == contract.REPETITION
    assert sidecar["verdict"]["flagged"] >= MIN_SAMPLES - MAX_NUM_SEQS
    assert probed["generation_tokens"] < MIN_SAMPLES * MAX_TOKENS
    assert sidecar["verdict"]["backend"] == "vllm" and sidecar["verdict"]["max_tokens"] == [MAX_TOKENS]
    assert sidecar["verdict"]["model"] == str(models / "never_stop")
    # One LLM.generate call for the whole task: the slow start sent MIN_SAMPLES to the engine
    # (8 running, 8 queued), the rest never; whatever was in the engine unfinished at the trip
    # was aborted there, and lm-eval got a blank answer for each of those and of the rest.
    final = sidecar["final"]
    aborted, blanked = final["cancelled_in_flight"], final["short_circuited_requests"]
    assert 0 < aborted <= MAX_NUM_SEQS and blanked == DOCS - MIN_SAMPLES + aborted
    given = answers(tmp_path / "probed")
    assert sorted(given) == [""] * blanked + ["a" * MAX_TOKENS] * (DOCS - blanked)
    read = subprocess.run([PYTHON, "-m", "probe", "read", str(tmp_path / "probed"), "--json"], capture_output=True)
    (verdict,) = json.loads(read.stdout)
    assert read.returncode == 1 and verdict["status"] == "below_floor"
    assert verdict["results_file"] and Path(verdict["results_file"]).exists()
    # The per-task evidence travels in lm-eval's results file from this backend too.
    evidence = json.loads(Path(verdict["results_file"]).read_text())[EVIDENCE_KEY]
    assert evidence["backends"] == ["vllm"] and evidence["tasks"][verdict["task"]]["tripped"] is True
    assert evidence["tasks"][verdict["task"]]["cancelled_in_flight"] == aborted


def test_the_slow_start_sends_the_engine_min_samples_before_any_evidence(models, task, tmp_path) -> None:
    # An engine as wide as the task: without a slow start vLLM would run all 48 to the cap
    # at once before the MIN_SAMPLES observations the cap rule needs (the loop detector off
    # here, so only endings count). With it, the engine gets MIN_SAMPLES requests, all at the
    # cap, and the trip answers the rest blank before they reach it.
    knobs = {contract.ENV_STREAM: "off"}
    run, probed = evaluate(models / "never_stop", task, tmp_path / "probed", True, max_num_seqs=DOCS, **knobs)
    assert "summary: TRIPPED (non_terminating)" in run.stderr
    assert probed["generation_tokens"] == MIN_SAMPLES * MAX_TOKENS  # vLLM's own count
    assert probed["finished_length"] == MIN_SAMPLES
    final = json.loads((tmp_path / "probed" / contract.SIDECAR_NAME).read_text())["final"]
    assert final["cancelled_in_flight"] == 0 and final["short_circuited_requests"] == DOCS - MIN_SAMPLES
    assert sorted(answers(tmp_path / "probed")) == [""] * (DOCS - MIN_SAMPLES) + ["a" * MAX_TOKENS] * MIN_SAMPLES


def test_each_group_keeps_its_own_slow_start_across_tasks_and_chunks(models, tmp_path) -> None:
    # Two tasks with different stop sequences (two groups) in one run, each in chunks of 10
    # (--batch_size 10: one LLM.generate call per chunk). Each group's budget is its own and
    # spans its chunks: each reaches the engine with exactly MIN_SAMPLES requests, all at the
    # cap, and the trip answers the rest of it blank (a budget per call would have let one
    # group's 16 be spread over two, or a chunk's 10 be sent whole after the first chunk's 10).
    first = write_task(tmp_path / "tasks", 24)
    second = write_task(tmp_path / "tasks", 24, task=SECOND_TASK)
    knobs = {contract.ENV_STREAM: "off"}
    run, probed = evaluate(
        models / "never_stop", first, tmp_path / "probed", True, max_num_seqs=48, batch_size="10", also=(second,),
        **knobs,
    )  # fmt: skip
    assert run.stderr.count("[lm-eval-probe] tripped:") == 2
    assert probed["generation_tokens"] == 2 * MIN_SAMPLES * MAX_TOKENS  # vLLM's own count
    final = json.loads((tmp_path / "probed" / contract.SIDECAR_NAME).read_text())["final"]
    assert final["short_circuited_requests"] == 2 * (24 - MIN_SAMPLES)


def test_watched_partial_outputs_leave_every_answer_as_unprobed(models, task, unprobed_never_stop, tmp_path) -> None:
    # The probe asks the engine for cumulative outputs on its copy of the sampling parameters;
    # LLM.generate must still hand lm-eval what it hands it unprobed: 1,024-token answers,
    # assembled by the engine over many reports. More samples than documents: no trip.
    plain, unprobed = unprobed_never_stop
    knobs = {contract.ENV_MIN_SAMPLES: str(DOCS + 1)}
    run, probed = evaluate(models / "never_stop", task, tmp_path / "probed", probed=True, **knobs)
    assert "[lm-eval-probe] internal error" not in run.stderr
    assert "partial outputs cannot be watched" not in run.stderr
    assert answers(tmp_path / "probed") == answers(plain) == ["a" * MAX_TOKENS] * DOCS
    assert probed["generation_tokens"] == unprobed["generation_tokens"]
    # ... while the detector did read them: it flagged every generation, which then ran to the cap.
    (results,) = written_by_lm_eval(tmp_path / "probed", "results_*.json")
    (evidence,) = json.loads(results.read_text())[EVIDENCE_KEY]["tasks"].values()
    assert evidence["flagged"] == DOCS and evidence["flagged_endings"] == {"length": DOCS}
    assert evidence["watched"] == DOCS


def test_parameters_that_forbid_partial_outputs_leave_the_cap_rule_as_before(models, tmp_path) -> None:
    # n=2: vLLM gathers a prompt's choices into one output only when it reports final outputs
    # only, so the probe leaves those parameters alone, says so once, and judges endings.
    # Two choices need sampling: babble's random letters never stop.
    small = write_task(tmp_path / "task", MIN_SAMPLES)
    sampled = "n=2,temperature=1"
    run, _ = evaluate(models / "babble", small, tmp_path / "out", probed=True, gen_kwargs=sampled)
    assert run.stderr.count("partial outputs cannot be watched (n=2 choices per prompt)") == 1
    assert "[lm-eval-probe] internal error" not in run.stderr
    assert "summary: TRIPPED (non_terminating)" in run.stderr
    sidecar = json.loads((tmp_path / "out" / contract.SIDECAR_NAME).read_text())
    # Judged by how the choices ended, all at the cap (two choices share one token count:
    # the cause is a length limit that cannot be told apart from the window).
    verdict = sidecar["verdict"]
    assert verdict["cause"] == contract.LENGTH and verdict["finish_reasons"] == {"length": verdict["observations"]}


def test_stopping_model_answers_as_unprobed_and_nothing_trips(models, task, tmp_path) -> None:
    _, unprobed = evaluate(models / "stops", task, tmp_path / "plain", probed=False)
    run, probed = evaluate(models / "stops", task, tmp_path / "probed", probed=True)
    assert f"the probe did not trip: 0 of {DOCS} generations observed were cut off" in run.stderr
    assert not (tmp_path / "probed" / contract.SIDECAR_NAME).exists()
    assert answers(tmp_path / "probed") == answers(tmp_path / "plain") == [" 7"] * DOCS
    assert probed["generation_tokens"] == unprobed["generation_tokens"]


def test_an_engine_that_cannot_be_hooked_runs_unprobed_with_one_message(models, tmp_path) -> None:
    # The hook point really absent: an engine without abort_request (an offline run never
    # calls it unless a request fails). This sitecustomize.py runs after the probe's own, in
    # every process: eval-probe's own has no vLLM.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "try:\n    import vllm\nexcept ImportError:\n    pass\nelse:\n    del vllm.LLMEngine.abort_request\n"
    )
    # MIN_SAMPLES documents: enough for a trip, had the probe been watching.
    small = write_task(tmp_path / "task", MIN_SAMPLES)
    run, counters = evaluate(models / "never_stop", small, tmp_path / "out", probed=True, site=site)
    # Counted in the whole of stderr: lm-eval's progress bar shares the probe's lines.
    assert run.stderr.count("[lm-eval-probe] could not hook vLLM's engine") == 1
    assert "has no abort_request')); lm-eval's vLLM backend runs unprobed" in run.stderr
    assert "[lm-eval-probe] internal error" not in run.stderr
    # Unprobed: every generation ran to the cap, and nothing was cut short or written.
    assert counters["generation_tokens"] == MIN_SAMPLES * MAX_TOKENS
    assert not (tmp_path / "out" / contract.SIDECAR_NAME).exists()
    assert answers(tmp_path / "out") == ["a" * MAX_TOKENS] * MIN_SAMPLES


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
from probe.runtime.vllm_partial import STREAM_INTERVAL, watched_params

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
