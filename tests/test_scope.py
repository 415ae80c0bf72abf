"""One evaluation, one scope: a sweep's evaluations never touch one another, the report at
exit describes the evaluations that ran, and probe-made start-up files never chain into each
other. Real lm-eval, real simulated servers, real child processes."""

from __future__ import annotations

import functools
import json
import shlex
import subprocess
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

import pytest
from support.procs import PYTHON, probe_site

from patcher.markers import SITECUSTOMIZE
from probe.demo.localtask import METRIC, offline_env, write_task
from probe.runtime.core import contract
from probe.runtime.core.contract import EVIDENCE_KEY
from probe.runtime.hooking import chain
from probe.runtime.hooking.patching import is_ours
from probe.runtime.registry import INTEGRATIONS, targets
from probe.runtime.scope import state

DOCS = 24

# Two simple_evaluate calls in one process, as a sweep over models does: the first against
# a server whose model never stops, the second against a healthy one, same task settings.
_SWEEP = """
import json, sys
import lm_eval
from lm_eval.loggers import EvaluationTracker

try:  # a task's YAML as a config, the way each release's own command line loads it
    from lm_eval.utils import load_yaml_config
except ImportError:
    from lm_eval.tasks._yaml_loader import load_yaml

    def load_yaml_config(path):
        return load_yaml(path, resolve_func=True)

for name, url in (("first", sys.argv[2]), ("second", sys.argv[3])):
    task = load_yaml_config(sys.argv[1])  # afresh: lm-eval 0.4.9.2 consumes the config it is given
    tracker = EvaluationTracker(output_path=f"{sys.argv[4]}/{name}")
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"model=sim,base_url={url}/v1/completions,num_concurrent=8,tokenized_requests=False,"
        "tokenizer_backend=None,max_retries=2",
        tasks=[task], gen_kwargs="max_tokens=2048", evaluation_tracker=tracker,
    )
    tracker.save_results_aggregated(results=results, samples=None)
"""


def _results(directory: Path) -> dict:
    (path,) = directory.glob("**/results_*.json")
    return json.loads(path.read_text())


@pytest.mark.entry
def test_a_sweeps_second_evaluation_gets_its_own_scope(sim, tmp_path: Path) -> None:
    task = write_task(tmp_path / "task", DOCS)
    never, healthy = sim("never_stop"), sim("healthy")
    output = tmp_path / "out"
    env = offline_env(probe_site(tmp_path / "site"), RESULT_DIR=str(output))
    command = [PYTHON, "-c", _SWEEP, str(task.yaml), never.base_url, healthy.base_url, str(output)]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    first, second = _results(output / "first"), _results(output / "second")
    # Every request of the second evaluation reached its own server, and was answered.
    assert healthy.snapshot()["generate_requests"] == DOCS
    assert second["results"][task.name][METRIC] == 1.0
    mine = second[EVIDENCE_KEY]
    assert (mine["tripped"], mine["tasks"][task.name]["observations"]) == (False, DOCS)
    assert mine["tasks"][task.name]["short_circuited"] == 0
    # The first evaluation tripped, under a run identity of its own, which its results carry.
    trip = json.loads((output / contract.SIDECAR_NAME).read_text())["verdict"]
    assert first[EVIDENCE_KEY]["tripped"] and first[EVIDENCE_KEY]["run_id"] == trip["run_id"]
    assert mine["run_id"] != trip["run_id"] and mine["sidecar"] is None


def test_the_report_describes_the_evaluations_and_an_idle_process_adds_nothing(sim, tmp_path: Path) -> None:
    """``eval-probe run`` of a script that runs lm-eval and then a Python that only imports
    it: the summary is lm-eval's, not "0 of 0 generations"."""
    task = write_task(tmp_path / "task", DOCS)
    server = sim("healthy")
    output = tmp_path / "out"
    evaluate = task.lm_eval_command(server.base_url, "sim", output, 2048, 8, model_args="max_retries=2")
    idle = [PYTHON, "-c", "import lm_eval.evaluator, lm_eval.models.api_models"]
    script = f"{shlex.join(evaluate)} && {shlex.join(idle)}"
    run = subprocess.run([PYTHON, "-m", "probe", "run", "--result-dir", str(output), "--", "bash", "-c", script],
                         env=offline_env(None), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"the probe did not trip: 0 of {DOCS} generations observed were cut off" in run.stderr
    assert "of 1 evaluation(s)" in run.stderr


_FORKED = """
import multiprocessing, sys
import lm_eval

def evaluate():
    lm_eval.simple_evaluate(
        model="local-completions",
        model_args=f"model=sim,base_url={sys.argv[2]}/v1/completions,num_concurrent=8,tokenized_requests=False,"
        "tokenizer_backend=None,max_retries=2",
        tasks=[sys.argv[1]], gen_kwargs="max_tokens=2048",
        task_manager=lm_eval.tasks.TaskManager(include_path=sys.argv[3]),
    )

worker = multiprocessing.get_context("fork").Process(target=evaluate)
worker.start()
worker.join()
sys.exit(worker.exitcode)
"""


def test_an_evaluation_in_a_forked_worker_is_reported(sim, tmp_path: Path) -> None:
    # A forked worker ends with os._exit, past every exit handler: its evaluation is reported as it ends.
    task = write_task(tmp_path / "task", DOCS)
    server = sim("healthy")
    command = [PYTHON, "-c", _FORKED, task.name, server.base_url, str(task.yaml.parent)]
    run = subprocess.run([PYTHON, "-m", "probe", "run", "--result-dir", str(tmp_path / "out"), "--", *command],
                         env=offline_env(None), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"the probe did not trip: 0 of {DOCS} generations observed were cut off" in run.stderr
    assert "of 1 evaluation(s)" in run.stderr


def test_a_forked_child_never_reports_the_scopes_it_inherited(sim, tmp_path: Path) -> None:
    server, report = sim("healthy"), tmp_path / "observed.json"
    code = (
        f"import os, sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"from support.lm import completions, generate\ngenerate(completions({server.base_url!r}), 5)\n"
        "child = os.fork()\nif child == 0:\n    sys.exit(0)\nos.waitpid(child, 0)\n"
    )
    env = offline_env(probe_site(tmp_path / "site"), HYPERLOOM_EVAL_PROBE_REPORT=str(report), RESULT_DIR=str(tmp_path))
    run = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    evaluations = json.loads(report.read_text())["evaluations"]
    assert [sum(g["observations"] for g in e["groups"]) for e in evaluations] == [5]


def test_every_process_of_a_command_adds_its_evaluations_to_the_report(sim, tmp_path: Path) -> None:
    server = sim("healthy")
    report = tmp_path / "observed.json"
    site = probe_site(tmp_path / "site")
    code = (
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"from support.lm import completions, generate\ngenerate(completions({server.base_url!r}), int(sys.argv[1]))\n"
    )
    env = offline_env(site, HYPERLOOM_EVAL_PROBE_REPORT=str(report), RESULT_DIR=str(tmp_path))
    for n in ("5", "7"):
        run = subprocess.run([PYTHON, "-c", code, n], env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
    idle = subprocess.run([PYTHON, "-c", "import lm_eval.models.api_models"], env=env, capture_output=True, timeout=120)
    assert idle.returncode == 0
    evaluations = json.loads(report.read_text())["evaluations"]
    assert [sum(g["observations"] for g in e["groups"]) for e in evaluations] == [5, 7]
    assert len({e["pid"] for e in evaluations}) == 2


def _user_site(directory: Path) -> Path:
    directory.mkdir()
    (directory / "sitecustomize.py").write_text("print('user start-up ran')\n")
    return directory


_ONCE = (
    "import sys; import lm_eval.models.api_models\n"
    "print('booted', getattr(sys, '_lm_eval_probe_booted', False))\n"
    "print('runtimes', sum(type(f).__name__ == 'EmbeddedRuntime' for f in sys.meta_path))\n"
)


def test_two_probe_made_sitecustomize_files_never_chain_into_each_other(tmp_path: Path) -> None:
    first, second = probe_site(tmp_path / "a"), probe_site(tmp_path / "b")
    user = _user_site(tmp_path / "user")
    env = offline_env(None, PYTHONPATH=f"{first}:{second}:{user}")
    run = subprocess.run([PYTHON, "-c", _ONCE], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "Error" not in run.stderr, run.stderr[-2000:]
    assert run.stdout.splitlines() == ["user start-up ran", "booted True", "runtimes 1"]


def test_a_nested_run_activates_the_probe_once_and_runs_the_users_start_up_once(tmp_path: Path) -> None:
    """``eval-probe run`` with a probe-made directory already on PYTHONPATH (installed by
    ``eval-probe install``, or an outer ``run``)."""
    user = _user_site(tmp_path / "user")
    env = offline_env(None, PYTHONPATH=f"{probe_site(tmp_path / 'a')}:{user}")
    command = [PYTHON, "-m", "probe", "run", "--", PYTHON, "-m", "probe", "run", "--", PYTHON, "-c", _ONCE]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "RecursionError" not in run.stderr, run.stderr[-2000:]
    assert [line for line in run.stdout.splitlines() if "eval-probe" not in line][-3:] == [
        "user start-up ran", "booted True", "runtimes 1",
    ]  # fmt: skip


def test_the_chain_knows_the_patchers_end_marker() -> None:
    assert SITECUSTOMIZE.end_line == chain.BLOCK_END


def test_a_file_with_the_users_code_besides_the_probe_is_never_skipped(tmp_path: Path) -> None:
    made = probe_site(tmp_path / "made") / "sitecustomize.py"
    assert chain._made_by_probe(made.read_text())
    assert not chain._made_by_probe(made.read_text() + "print('mine')\n")


def test_a_probe_made_file_is_known_when_its_loader_gives_no_source(tmp_path: Path) -> None:
    made = probe_site(tmp_path / "made") / "sitecustomize.py"

    class NoSource:  # a wrapping loader that says, as InspectLoader does, that it has no source
        def get_source(self, name: str) -> str:
            raise ImportError(name)

    assert chain._probes(ModuleSpec("sitecustomize", NoSource(), origin=str(made)))
    assert not chain._probes(ModuleSpec("sitecustomize", NoSource(), origin=str(tmp_path / "gone.py")))


def test_the_stub_waits_for_every_integration_and_nothing_else() -> None:
    from probe.inject import sitecustomize_text

    assert f"{targets()!r})" in sitecustomize_text()
    assert len(set(targets())) == len(INTEGRATIONS)


@pytest.mark.entry
@pytest.mark.parametrize(
    ("name", "where", "hooks"),
    [("lm_eval.evaluator", None, ("simple_evaluate", "evaluate")),
     ("lm_eval.models.api_models", "TemplateAPI", ("generate_until", "amodel_call", "model_call"))],
)  # fmt: skip
def test_each_integration_installs_and_uninstalls_symmetrically(name: str, where: str | None, hooks: tuple,
                                                                 result_dir) -> None:  # fmt: skip
    import importlib

    from probe.runtime import install
    from probe.runtime.registry import integration_for

    integration, module = integration_for(name), importlib.import_module(name)
    before = dict(vars(module))
    owner = getattr(module, where) if where else module
    try:
        assert install.install_integration(integration, module) and all(is_ours(owner.__dict__[h]) for h in hooks)
        installed = {h: owner.__dict__[h] for h in hooks}
        assert install.install_integration(integration, module)  # idempotent
        assert {h: owner.__dict__[h] for h in hooks} == installed
    finally:
        integration.uninstall(module)
        install.uninstall()
    assert not any(is_ours(owner.__dict__[h]) for h in hooks)
    assert {k: v for k, v in vars(module).items() if k in before} == before


def _hooks_of(integration: Any, module: Any) -> list[tuple[Any, str]]:
    """What installing ``integration`` puts in place, each (owner, attribute name)."""
    from probe.runtime import install
    from probe.runtime.hooking import patching

    before = len(patching._ORIGINALS)
    assert install.install_integration(integration, module)
    return [(owner, name) for owner, name, _ in patching._ORIGINALS[before:]]


@pytest.mark.parametrize(
    "integration",
    # Those whose modules import torch or vLLM run in the pass that has them (marked hf).
    [pytest.param(i, id=i.waits_for, marks=() if i.waits_for in ("lm_eval.evaluator", "lm_eval.models.api_models")
                  else pytest.mark.hf) for i in INTEGRATIONS],
)  # fmt: skip
def test_a_reinstall_puts_back_every_hook_a_pipelines_wrapper_did_not_keep(integration: Any, result_dir) -> None:
    """Whichever hook a pipeline wraps (functools.wraps, so it carries the probe's wrapper inside
    it through an uninstall), installing again puts every other hook back: no one hook stands for
    the install (the surviving amodel_call once did, and the sync path ran unprobed)."""
    from probe.runtime import install
    from probe.runtime.hooking.patching import is_ours_within

    module = pytest.importorskip(integration.waits_for)
    try:
        hooks = _hooks_of(integration, module)
        install.uninstall()
        assert hooks
        for kept_owner, kept_name in hooks:
            original = kept_owner.__dict__[kept_name]
            try:
                _hooks_of(integration, module)
                ours = kept_owner.__dict__[kept_name]
                inner = ours.__func__ if isinstance(ours, staticmethod) else ours
                kept = functools.wraps(inner)(lambda *args, _inner=inner, **kwargs: _inner(*args, **kwargs))
                kept = staticmethod(kept) if isinstance(ours, staticmethod) else kept  # a hook of the same kind
                setattr(kept_owner, kept_name, kept)  # the pipeline's, holding the probe's
                install.uninstall()
                assert install.install_integration(integration, module)
                missing = [name for owner, name in hooks if not is_ours_within(owner.__dict__.get(name))]
                assert not missing, f"kept {kept_name}: not put back: {missing}"
            finally:
                install.uninstall()
                setattr(kept_owner, kept_name, original)
    finally:
        install.uninstall()


def test_a_reinstall_that_fails_half_way_undoes_only_its_own_work(result_dir, capsys) -> None:
    """An install refused after it patched something (as HF's checks refuse a pipeline's plain
    wrapper) undoes that, never the working install an earlier call made, nor one made meanwhile
    (here the evaluator's, from inside the failing call; another thread's is the same case)."""
    import dataclasses

    from lm_eval import evaluator
    from lm_eval.models import api_models

    from probe.runtime import install
    from probe.runtime.hooking.patching import is_ours, mark, wrap
    from probe.runtime.registry import integration_for

    integration = integration_for("lm_eval.models.api_models")
    template = api_models.TemplateAPI
    own = template.__dict__["tok_encode"]

    def refuses(module: Any) -> None:
        wrap(module.TemplateAPI, "tok_encode", lambda original: mark(lambda *a, **k: original(*a, **k), original))
        assert install.install_integration(integration_for("lm_eval.evaluator"), evaluator)
        raise LookupError("not as this probe knows it")

    try:
        assert install.install_integration(integration, api_models)
        assert not install.install_integration(dataclasses.replace(integration, install=refuses), api_models)
        assert all(is_ours(template.__dict__[name]) for name in ("generate_until", "amodel_call", "model_call"))
        assert template.__dict__["tok_encode"] is own  # its own half-way work undone
        assert is_ours(vars(evaluator)["simple_evaluate"]) and is_ours(vars(evaluator)["evaluate"])
        assert "run(s) unprobed, but for the hooks an earlier install put in place" in capsys.readouterr().err
    finally:
        install.uninstall()
        template.tok_encode = own


@pytest.mark.entry
def test_an_evaluation_started_after_another_tripped_is_a_fresh_scope(result_dir) -> None:
    """The scopes themselves: a new evaluation owns new groups, lock, gates, sidecar and run id."""
    import lm_eval.evaluator  # noqa: F401 - imported here: uninstalling must leave it imported

    from probe.runtime import install

    try:
        assert install.install()
        default = state.ACTIVE
        first = state.begin_evaluation(default.settings)
        first.groups.get({"max_tokens": 2048}).tripped = True
        second = state.begin_evaluation(default.settings)
        assert state.ACTIVE is second and default not in state.SCOPES  # idle default scope dropped
        assert not second.groups.get({"max_tokens": 2048}).tripped
        assert second.lock is not first.lock and second.gates is not first.gates
        assert second.ownership is not first.ownership and second.run_id != first.run_id
        assert [first, second] == state.SCOPES
    finally:
        install.uninstall()
    assert state.SCOPES == [] and state.ACTIVE is None
    assert sys.modules.get("lm_eval.evaluator") is not None


# What the scripts below share: a task YAML loaded the way each release loads it, and the model
# arguments of the simulated server.
_TASK_AND_ARGS = """
try:
    from lm_eval.utils import load_yaml_config
except ImportError:
    from lm_eval.tasks._yaml_loader import load_yaml

    def load_yaml_config(path):
        return load_yaml(path, resolve_func=True)

ARGS = ("model=sim,base_url={}/v1/completions,num_concurrent=8,tokenized_requests=False,tokenizer_backend=None,"
        "max_retries=2")
"""


# A sweep that does not go through simple_evaluate: the first evaluation trips, then the
# script calls lm-eval's evaluate itself on a model it built, against a healthy server.
_DIRECT = (
    """
import json, sys
import lm_eval, lm_eval.evaluator
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager, get_task_dict
"""
    + _TASK_AND_ARGS
    + """lm_eval.simple_evaluate(model="local-completions", model_args=ARGS.format(sys.argv[2]),
                        tasks=[load_yaml_config(sys.argv[1])], gen_kwargs="max_tokens=2048")
lm = get_model("local-completions").create_from_arg_string(ARGS.format(sys.argv[3]))
tasks = get_task_dict([load_yaml_config(sys.argv[1])], TaskManager())
for task in tasks.values():
    task.set_config(key="generation_kwargs", value={"max_tokens": 2048}, update=True)
results = lm_eval.evaluator.evaluate(lm=lm, task_dict=tasks)
evidence = results["hyperloom_eval_probe"]
print(json.dumps([results["results"][sys.argv[4]][sys.argv[5]], evidence["tripped"], evidence["tasks"]]))
"""
)


@pytest.mark.entry
def test_an_evaluation_through_evaluate_itself_gets_its_own_scope(sim, tmp_path: Path) -> None:
    task = write_task(tmp_path / "task", DOCS)
    never, healthy = sim("never_stop"), sim("healthy")
    output = tmp_path / "out"
    env = offline_env(probe_site(tmp_path / "site"), RESULT_DIR=str(output))
    command = [PYTHON, "-c", _DIRECT, str(task.yaml), never.base_url, healthy.base_url, task.name, METRIC]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert healthy.snapshot()["generate_requests"] == DOCS
    score, tripped, tasks = json.loads(run.stdout.splitlines()[-1])
    assert (score, tripped, tasks[task.name]["observations"]) == (1.0, False, DOCS)


_THREADS = (
    """
import sys, threading
import lm_eval
"""
    + _TASK_AND_ARGS
    + """scores = {}
# One task index, made before the threads: lm-eval's indexing of its task files is not
# thread-safe (0.4.9.2 then reads one file's !function beside another's), the probe aside;
# and tqdm's class lock made before them too (tqdm.contrib.concurrent, which lm-eval 0.4.12
# uses, deletes a lock it made on exit, under the other thread's feet).
from lm_eval.tasks import TaskManager
from tqdm import tqdm
MANAGER = TaskManager()
tqdm.get_lock()

def evaluate(url):
    results = lm_eval.simple_evaluate(model="local-completions", model_args=ARGS.format(url),
                                      tasks=[load_yaml_config(sys.argv[1])], gen_kwargs="max_tokens=2048",
                                      task_manager=MANAGER)
    evidence = results["hyperloom_eval_probe"]
    scores[url] = (evidence["tripped"], sum(t["observations"] for t in evidence["tasks"].values()))

threads = [threading.Thread(target=evaluate, args=(url,)) for url in sys.argv[2:]]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print([scores[url] for url in sys.argv[2:]])
"""
)


def test_two_threads_evaluating_at_once_each_use_their_own_scope(sim, tmp_path: Path) -> None:
    """Before, the later evaluation's scope replaced the earlier one's in mid-run: the
    run hung (the gates of one scope never released the other's calls)."""
    task = write_task(tmp_path / "task", DOCS)
    never, healthy = sim("never_stop", seconds_per_token=0.0005), sim("healthy")
    env = offline_env(probe_site(tmp_path / "site"), RESULT_DIR=str(tmp_path / "out"))
    command = [PYTHON, "-c", _THREADS, str(task.yaml), never.base_url, healthy.base_url]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines()[-1] == f"[(True, 16), (False, {DOCS})]"
    assert healthy.snapshot()["generate_requests"] == DOCS


@pytest.mark.parametrize("fifo", ["report", "lock"])
def test_a_report_or_its_lock_that_is_a_fifo_never_hangs_the_process_at_exit(sim, tmp_path: Path, fifo: str) -> None:
    """Before, opening the report (or the lock beside it) waited forever for a writer."""
    import os

    server = sim("healthy")
    report = tmp_path / "observed.json"
    os.mkfifo(report if fifo == "report" else f"{report}.lock")
    code = (
        f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        f"from support.lm import completions, generate\ngenerate(completions({server.base_url!r}), 3)\n"
    )
    env = offline_env(probe_site(tmp_path / "site"), HYPERLOOM_EVAL_PROBE_REPORT=str(report), RESULT_DIR=str(tmp_path))
    run = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"could not write the observation report {report}" in run.stderr
    assert report.is_fifo() or Path(f"{report}.lock").is_fifo()  # left as it is


def test_a_probe_block_that_stands_down_still_runs_the_users_file_it_shadows(tmp_path: Path) -> None:
    """An installed directory whose file also holds the user's code (appended), with the
    user's own sitecustomize.py after it: under ``eval-probe run`` (whose probe-made file
    comes first and chains into it) the user's file still runs, once, as it does unwrapped."""
    mine = probe_site(tmp_path / "mine")
    with (mine / "sitecustomize.py").open("a") as handle:
        handle.write("print('appended ran')\n")
    user = _user_site(tmp_path / "user")
    env = offline_env(None, PYTHONPATH=f"{mine}:{user}")
    alone = subprocess.run([PYTHON, "-c", _ONCE], env=env, capture_output=True, text=True, timeout=60)
    command = [PYTHON, "-m", "probe", "run", "--", PYTHON, "-c", _ONCE]
    wrapped = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert wrapped.returncode == 0 and "Error" not in wrapped.stderr, wrapped.stderr[-2000:]
    expected = ["user start-up ran", "appended ran", "booted True", "runtimes 1"]
    assert alone.stdout.splitlines() == expected
    assert [line for line in wrapped.stdout.splitlines() if "eval-probe" not in line][-4:] == expected
