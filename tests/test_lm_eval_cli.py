"""The real ``python -m lm_eval`` command with the probe installed through sitecustomize.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.importtime import sitecustomize_cost
from support.procs import PYTHON
from support.resultfiles import written_by_lm_eval

from probe.demo.localtask import METRIC, offline_env, task_name, write_task
from probe.inject import sitecustomize_text
from probe.runtime.core import contract


def lm_eval(site: Path | None, server, task, output: Path, *extra: str, max_tokens: int = 2048, **env: str):
    command = task.lm_eval_command(server.base_url, "sim", output, max_tokens, 16, *extra, model_args="max_retries=2")
    return subprocess.run(command, env=offline_env(site, **env), capture_output=True, text=True, timeout=300)


def score(output: Path) -> float:
    (results,) = written_by_lm_eval(output, "results_*.json")
    return json.loads(results.read_text())["results"][task_name()][METRIC]


@pytest.mark.entry
def test_lm_eval_run_trips_and_finishes_with_a_real_results_file(sim, site_dir, local_task, tmp_path) -> None:
    server = sim("never_stop")
    output = tmp_path / "out"
    run = lm_eval(site_dir, server, local_task, output, EVAL_RESULT_DIR=str(output))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "[lm-eval-probe] tripped" in run.stderr
    assert score(output) == 0.0
    sidecar = json.loads((output / contract.SIDECAR_NAME).read_text())
    assert sidecar["verdict"]["model"] == "sim" and sidecar["final"]["short_circuited_requests"] > 0
    assert server.snapshot()["generate_requests"] < 40


@pytest.mark.entry
def test_a_launcher_that_looks_up_the_backend_first_still_trips(sim, site_dir, local_task, tmp_path) -> None:
    # A launcher that checks which backends exist before it runs lm-eval's command.
    server, output = sim("never_stop"), tmp_path / "out"
    command = local_task.lm_eval_command(server.base_url, "sim", output, 2048, 16, model_args="max_retries=2")
    launcher = (
        "import importlib.util, runpy, sys\n"
        "assert importlib.util.find_spec('lm_eval.models.api_models') is not None\n"
        "sys.argv[0] = 'lm_eval'\nrunpy.run_module('lm_eval', run_name='__main__', alter_sys=True)"
    )
    assert command[1:3] == ["-m", "lm_eval"]
    env = offline_env(site_dir, EVAL_RESULT_DIR=str(output))
    launched = [command[0], "-c", launcher, *command[3:]]
    run = subprocess.run(launched, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "[lm-eval-probe] tripped" in run.stderr and score(output) == 0.0
    assert server.snapshot()["generate_requests"] < 40


@pytest.mark.entry
def test_the_samples_file_marks_every_blank_and_no_answer_of_the_model(sim, site_dir, tmp_path) -> None:
    # The first 3 answers are the model's own empty ones; the rest never stop, and the probe trips
    # long before the last of 120 requests is sent.
    server, output, task = (
        sim("never_stop", first_n=3, first_reason="stop"),
        tmp_path / "out",
        write_task(tmp_path / "t", 120),
    )
    run = lm_eval(site_dir, server, task, output, "--log_samples", EVAL_RESULT_DIR=str(output))
    assert run.returncode == 0 and "[lm-eval-probe] tripped" in run.stderr, run.stderr[-2000:]
    (samples,) = written_by_lm_eval(output, "samples_*.jsonl")
    records = [json.loads(line) for line in samples.read_text().splitlines()]
    marked = [r for r in records if contract.EVIDENCE_KEY in r]
    empty = [r for r in records if r["resps"] == [[""]]]
    (results,) = written_by_lm_eval(output, "results_*.json")
    evidence = json.loads(results.read_text())[contract.EVIDENCE_KEY]["tasks"][task_name()]
    assert len(marked) == evidence["short_circuited"] > 0
    assert all(r[contract.EVIDENCE_KEY]["blank_answers"] == 1 and r["resps"] == [[""]] for r in marked)
    assert len(empty) == len(marked) + 3  # the model's own empty answers are left as they are


@pytest.mark.entry
def test_healthy_lm_eval_run_scores_like_unprobed(sim, site_dir, local_task, tmp_path) -> None:
    server = sim("healthy")
    unprobed = lm_eval(None, server, local_task, tmp_path / "plain")
    probed = lm_eval(site_dir, server, local_task, tmp_path / "probed", RESULT_DIR=str(tmp_path / "probed"))
    assert unprobed.returncode == probed.returncode == 0
    assert score(tmp_path / "plain") == score(tmp_path / "probed") == 1.0
    assert not (tmp_path / "probed" / contract.SIDECAR_NAME).exists()


@pytest.mark.entry
@pytest.mark.parametrize("mode", ["healthy", "never_stop"])
def test_settings_no_json_reader_holds_leave_the_runs_files_readable(sim, site_dir, local_task, tmp_path, mode) -> None:
    # Hostile round 27: lm-eval passes --gen_kwargs as given, and never sends do_sample to the
    # server; the probe wrote NaN and a 401-digit budget into its evidence and its sidecar, and
    # then the reader refused the run's own files (and the trip's final counters were lost).
    output, big = tmp_path / "out", "1" + "0" * 400
    settings = (
        "--gen_kwargs",
        f"max_tokens={big},do_sample=nan" if mode == "healthy" else "max_tokens=2048,do_sample=inf",
    )
    run = lm_eval(site_dir, sim(mode), local_task, output, *settings, RESULT_DIR=str(output))
    assert run.returncode == 0, run.stderr[-2000:]
    read = subprocess.run([PYTHON, "-m", "probe", "read", str(output), "--json"], capture_output=True, text=True)
    (verdict,) = json.loads(read.stdout)
    assert verdict["status"] == ("ok" if mode == "healthy" else "below_floor"), verdict["reason"]
    if mode == "never_stop":
        assert verdict["sidecar"]["state"] == "valid" and "[lm-eval-probe] could not" not in run.stderr
        sidecar = json.loads((output / contract.SIDECAR_NAME).read_text())
        assert sidecar["verdict"]["group"]["do_sample"] == "inf" and sidecar["final"]["short_circuited_requests"] > 0


def test_use_cache_then_unprobed_rerun_gets_real_answers(sim, site_dir, local_task, tmp_path) -> None:
    cache = str(tmp_path / "cache" / "lm")
    never = sim("never_stop")
    first = lm_eval(site_dir, never, local_task, tmp_path / "a", "--use_cache", cache, RESULT_DIR=str(tmp_path / "a"))
    assert first.returncode == 0 and "[lm-eval-probe] tripped" in first.stderr
    healthy = sim("healthy")
    second = lm_eval(
        None, healthy, local_task, tmp_path / "b", "--use_cache", cache, "--log_samples", HYPERLOOM_EVAL_PROBE="0"
    )
    assert second.returncode == 0, second.stderr[-2000:]
    (samples,) = written_by_lm_eval(tmp_path / "b", f"samples_{task_name()}_*.jsonl")
    responses = [json.loads(line)["resps"][0][0] for line in samples.read_text().splitlines()]
    # Only the blanks were kept out of the cache: the real (never-stopping) answers replay,
    # and every short-circuited request is asked again, of the now healthy server.
    assert "" not in responses
    assert healthy.snapshot()["generate_requests"] == sum(1 for r in responses if not r.startswith(" and"))
    assert healthy.snapshot()["generate_requests"] >= 24


def test_python_without_lm_eval_starts_clean(site_dir) -> None:
    """The system Python (no lm-eval) with the body installed: no output, stdlib only."""
    env = offline_env(site_dir, PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run(
        ["python3", "-X", "importtime", "-c", "import json; print(json.dumps({'ok': True}))"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0 and run.stdout == '{"ok": true}\n'
    assert not [line for line in run.stderr.splitlines() if not line.startswith("import time:")]
    _, nested = sitecustomize_cost(run.stderr)
    assert set(nested) <= {"importlib.util", "importlib.machinery", "importlib._abc", "_distutils_hack"}


def test_body_appended_twice_installs_once(site_dir, sim, tmp_path) -> None:
    site = site_dir / "sitecustomize.py"
    site.write_text(sitecustomize_text() + sitecustomize_text())
    check = (
        "import lm_eval.models.api_models as m, sys\n"
        "f = m.TemplateAPI.__dict__['amodel_call']\n"
        "print(getattr(f, '__lm_eval_probe__', False), getattr(f.__wrapped__, '__lm_eval_probe__', False),"
        " '_hyperloom_eval_probe' in sys.modules)\n"
    )
    run = subprocess.run([PYTHON, "-c", check], env=offline_env(site_dir), capture_output=True, text=True)
    assert run.stdout.split() == ["True", "False", "True"], run.stderr


def test_disabled_probe_leaves_lm_eval_untouched(site_dir) -> None:
    check = "import lm_eval.models.api_models as m\nprint(hasattr(m.TemplateAPI.amodel_call, '__lm_eval_probe__'))"
    run = subprocess.run(
        [PYTHON, "-c", check],
        env=offline_env(site_dir, HYPERLOOM_EVAL_PROBE="false"),
        capture_output=True,
        text=True,
    )
    assert run.stdout.strip() == "False" and run.stderr == ""


def test_bad_knob_warns_once_in_a_real_process(site_dir) -> None:
    check = "import lm_eval.models.api_models"
    env = offline_env(site_dir, HYPERLOOM_EVAL_PROBE_MIN_SAMPLES="lots")
    run = subprocess.run([PYTHON, "-c", check], env=env, capture_output=True, text=True)
    assert run.returncode == 0
    assert run.stderr.count("HYPERLOOM_EVAL_PROBE_MIN_SAMPLES='lots'") == 1


# However lm-eval's API model module is first imported. InferenceX's lm-eval (b315ef3) and 0.4.13
# load the model registry lazily (a name maps to "module:Class" until it is asked for); the 0.4.9.2
# release imports every model module with lm_eval.models.
FIRST_IMPORTS = {
    "the API module": "import lm_eval.models.api_models",
    "a model module": "from lm_eval.models.openai_completions import LocalChatCompletion",
    "the registry": "import lm_eval.models\nfrom lm_eval.api.registry import get_model\nget_model('local-completions')",
    "importlib": "import importlib\nimportlib.import_module('lm_eval.models.openai_completions')",
    "the evaluator": "import lm_eval.evaluator",
    # Ways to ask about a module without running it, or to run it again: none unhooks the probe.
    "a look-up first": "import importlib.util\nimportlib.util.find_spec('lm_eval.models.api_models')\n"
    "importlib.util.find_spec('lm_eval.models.openai_completions')",
    "pkgutil first": "import pkgutil, importlib.util\nimportlib.util.find_spec('lm_eval.models')\n"
    "pkgutil.find_loader('lm_eval.models.api_models')",
    "a failed import, retried": "import sys\nsys.modules['lm_eval.models.utils'] = None\ntry:\n"
    "    import lm_eval.models.api_models\nexcept ImportError:\n    del sys.modules['lm_eval.models.utils']\n"
    "import lm_eval.models.api_models",
    "a reload": "import importlib, lm_eval.models.api_models as api\nimportlib.reload(api)",
    # An import hook ahead of the probe's that asks the finders after it (a tracer, a vendoring shim).
    "a hook that asks the others": "import sys\nclass Ask:\n    def find_spec(self, name, path=None, target=None):\n"
    "        if name.startswith('lm_eval'):\n            for finder in sys.meta_path:\n"
    "                found = finder is not self and getattr(finder, 'find_spec', None)\n"
    "                spec = found and found(name, path, target)\n                if spec:\n"
    "                    return spec\nsys.meta_path.insert(0, Ask())\nimport lm_eval.models.api_models",
}
# The model lm-eval's registry hands out is the probed one. (The 0.4.9.2 release's get_model does
# not import lm_eval.models itself.)
PROBED = (
    "import sys\nimport lm_eval.models\nfrom lm_eval.api.registry import get_model\n"
    "print(getattr(get_model('local-chat-completions').amodel_call, '__lm_eval_probe__', False),"
    " '_hyperloom_eval_probe' in sys.modules)\n"
)


@pytest.mark.entry
@pytest.mark.parametrize("first", FIRST_IMPORTS.values(), ids=FIRST_IMPORTS.keys())
def test_the_probe_loads_however_lm_evals_api_models_are_first_imported(site_dir, first: str) -> None:
    run = subprocess.run([PYTHON, "-c", f"{first}\n{PROBED}"], env=offline_env(site_dir), capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True", "True"], run.stderr[-2000:]


@pytest.mark.entry
@pytest.mark.parametrize("first", ["import lm_eval", "import lm_eval.models", "import lm_eval.api.registry"])
def test_the_runtime_loads_exactly_when_lm_evals_api_module_does(site_dir, first: str) -> None:
    """A lazy registry imports no model module until a model is asked for: nor does the probe wake."""
    loaded = "print('lm_eval.models.api_models' in sys.modules, '_hyperloom_eval_probe' in sys.modules)"
    check = f"{first}\nimport sys\n{loaded}"
    run = subprocess.run([PYTHON, "-c", check], env=offline_env(site_dir), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    api_loaded, probe_loaded = run.stdout.split()
    assert api_loaded == probe_loaded, run.stdout
