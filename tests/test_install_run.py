"""`eval-probe install DIR` and `eval-probe run -- COMMAND`, in real subprocesses."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from importlib.machinery import BuiltinImporter, FrozenImporter, PathFinder
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.procs import PYTHON
from support.resultfiles import figures

from patcher.install import install
from patcher.markers import SITECUSTOMIZE
from probe import lmeval_args
from probe.demo.localtask import offline_env
from probe.inject import payload
from probe.lmeval_args import output_path_in
from probe.run import _unhooking_flags
from probe.runtime.core import contract
from probe.runtime.hooking.bootstrap import shadows_another
from probe.summary import summary

USER_SITE = "import sys\nsys.stderr.write('user sitecustomize ran\\n')\nUSER_VALUE = 42\n"
CHECK = (
    "import lm_eval.models.api_models as m\n"
    "print(getattr(m.TemplateAPI.__dict__['amodel_call'], '__lm_eval_probe__', False))\n"
)


def test_install_into_an_empty_dir_chains_the_shadowed_sitecustomize(tmp_path: Path) -> None:
    user, ours = tmp_path / "user", tmp_path / "ours"
    user.mkdir()
    (user / "sitecustomize.py").write_text(USER_SITE)
    assert install(ours, payload()).code == 0
    env = offline_env(None, PYTHONPATH=f"{ours}:{user}")
    run = subprocess.run([PYTHON, "-c", CHECK], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "True"
    assert run.stderr.count("user sitecustomize ran") == 1


@pytest.mark.parametrize("kind", ["package", "zip"])
def test_a_shadowed_sitecustomize_in_a_package_or_a_zip_is_chained(tmp_path: Path, kind: str) -> None:
    # The chain is compiled only when another sitecustomize is on the path: it must be found
    # however Python would import it, not only as a plain file.
    ours = tmp_path / "ours"
    if kind == "package":
        user = tmp_path / "user"
        (user / "sitecustomize").mkdir(parents=True)
        (user / "sitecustomize" / "__init__.py").write_text(USER_SITE)
    else:
        user = tmp_path / "user.zip"
        with zipfile.ZipFile(user, "w") as archive:
            archive.writestr("sitecustomize.py", USER_SITE)
    assert install(ours, payload()).code == 0
    env = offline_env(None, PYTHONPATH=f"{ours}:{user}")
    run = subprocess.run([PYTHON, "-c", CHECK], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "True"
    assert run.stderr.count("user sitecustomize ran") == 1


# A user's sitecustomize.py may define any name (a helper called set, `from numpy import *` brings
# any): the stub appended to it must see Python's built-ins, never the file's names.
SHADOWING_SITE = (
    "import os\n"
    "def set(name, value):\n    os.environ.setdefault(name, value)\n"
    "set('LM_EVAL_PROBE_TEST_SET', '1')\n"
    "any = getattr = isinstance = compile = exec = __import__ = lambda *a, **k: True\n"
    "Exception = None\n"
    "_lm_eval_probe_builtins = 'mine'\n"
)


def test_a_probe_block_appended_to_a_file_sees_builtins_never_the_files_names(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(SHADOWING_SITE)
    assert install(tmp_path, payload()).code == 0
    for cached in (False, True):  # compiled in the process, then from the bytecode Python kept
        env = offline_env(tmp_path)
        env.pop("PYTHONDONTWRITEBYTECODE", None) if cached else env.update(PYTHONDONTWRITEBYTECODE="1")
        check = CHECK + "import sitecustomize as s\nprint(s._lm_eval_probe_builtins, s.set.__module__)\n"
        run = subprocess.run([PYTHON, "-c", check], env=env, capture_output=True, text=True)
        assert (run.stdout.split(), run.stderr) == (["True", "mine", "sitecustomize"], "")


FINDER = (
    "import importlib.util, os, sys\n"
    "class Finder:  # as a setuptools editable install serves a module: a meta-path finder\n"
    "    def find_spec(self, name, path, target):  # all three required, as some finders have it\n"
    "        if name != 'sitecustomize':\n"
    "            return None\n"
    "        where = os.path.join(os.environ['USER_PROJECT'], 'sitecustomize.py')\n"
    "        if os.environ.get('IN_MEMORY'):  # a spec with no file, as an in-memory finder gives\n"
    "            source = open(where).read()\n"
    "            class Loader:\n"
    "                def create_module(self, spec): return None\n"
    "                def exec_module(self, module): exec(source, module.__dict__)\n"
    "            return importlib.util.spec_from_loader(name, Loader())\n"
    "        return importlib.util.spec_from_file_location(name, where)\n"
    "sys.meta_path.append(Finder())\n"
)


@pytest.mark.parametrize("in_memory", ["", "1"])
def test_a_sitecustomize_served_by_another_finder_is_chained_once(tmp_path: Path, in_memory: str) -> None:
    # An editable install serves modules through a finder after the path's: Python imports the
    # user's sitecustomize from it, so a probe-made file that shadows it must run it too, once,
    # also when the probe's file is imported again (a reload).
    venv, project, ours = tmp_path / "venv", tmp_path / "project", tmp_path / "ours"
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python*/site-packages")
    (site / "user_finder.py").write_text(FINDER)
    (site / "__editable__.user.pth").write_text("import user_finder\n")
    project.mkdir()
    (project / "sitecustomize.py").write_text(USER_SITE)
    assert install(ours, payload()).code == 0
    check = (  # `import sitecustomize` is the user's module, as without the probe
        "import sys, sitecustomize\nprint(sitecustomize.USER_VALUE, getattr(sys, '_lm_eval_probe_booted', False))\n"
    )
    env = offline_env(None, USER_PROJECT=str(project), IN_MEMORY=in_memory)
    alone = subprocess.run([venv / "bin" / "python", "-c", check], env=env, capture_output=True, text=True)
    assert alone.stdout.split() == ["42", "False"]
    assert alone.stderr.count("user sitecustomize ran") == 1  # what the probe shadows
    env["PYTHONPATH"] = str(ours)
    run = subprocess.run([venv / "bin" / "python", "-c", check], env=env, capture_output=True, text=True)
    assert run.stdout.split() == ["42", "True"]
    assert run.stderr.count("user sitecustomize ran") == 1, run.stderr
    assert "[lm-eval-probe]" not in run.stderr
    # A reload finds the probe's file first on the path: its chain has run, and runs nothing more.
    reload = "import importlib, sitecustomize\nimportlib.reload(sitecustomize)\n"
    run = subprocess.run([venv / "bin" / "python", "-c", reload], env=env, capture_output=True, text=True)
    assert run.stderr.count("user sitecustomize ran") == 1, run.stderr


class _ServesNothing:
    def find_spec(self, name: str, path: object, target: object) -> None:
        return None


def test_the_chain_is_compiled_only_where_another_sitecustomize_would_be_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A finder that serves no sitecustomize (setuptools puts one on every path) costs no chain.
    ours, user = tmp_path / "ours", tmp_path / "user"
    ours.mkdir()
    user.mkdir()
    origin = str(ours / "sitecustomize.py")
    monkeypatch.setattr(sys, "meta_path", [BuiltinImporter, FrozenImporter, PathFinder, _ServesNothing()])
    monkeypatch.setattr(sys, "path", [str(ours), str(user)])
    assert not shadows_another(origin)
    (user / "sitecustomize.py").write_text(USER_SITE)
    assert shadows_another(origin)


def test_a_probe_made_file_in_a_zip_is_skipped_as_one_on_disk_is(tmp_path: Path) -> None:
    ours, archive, user = tmp_path / "ours", tmp_path / "probe.zip", tmp_path / "user"
    assert install(ours, payload()).code == 0
    with zipfile.ZipFile(archive, "w") as packed:
        packed.write(ours / "sitecustomize.py", "sitecustomize.py")
    user.mkdir()
    (user / "sitecustomize.py").write_text(USER_SITE)
    env = offline_env(None, PYTHONPATH=f"{ours}:{archive}:{user}")
    check = "import sys; print(sorted(sys._lm_eval_probe_chained))"
    run = subprocess.run([PYTHON, "-c", check], env=env, capture_output=True, text=True, timeout=60)
    assert run.stderr.count("user sitecustomize ran") == 1
    assert str(archive) not in run.stdout and str(user / "sitecustomize.py") in run.stdout


SELF_CHAINING = (  # ddtrace's bootstrap: leave the path, then import the next sitecustomize
    "import os, sys\n"
    "sys.stderr.write('self-chaining ran\\n')\n"
    "here = os.path.dirname(os.path.abspath(__file__))\n"
    "sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]\n"
    "del sys.modules['sitecustomize']\n"
    "import sitecustomize\n"
)


def test_a_shadowed_sitecustomize_that_imports_the_next_one_reaches_it(tmp_path: Path) -> None:
    ours, chaining, user = tmp_path / "ours", tmp_path / "chaining", tmp_path / "user"
    assert install(ours, payload()).code == 0
    for folder, text in ((chaining, SELF_CHAINING), (user, USER_SITE)):
        folder.mkdir()
        (folder / "sitecustomize.py").write_text(text)
    check = "import sitecustomize; print(sitecustomize.USER_VALUE)"
    for path in (f"{chaining}:{user}", f"{ours}:{chaining}:{user}"):  # without the probe, then with it
        env = offline_env(None, PYTHONPATH=path)
        run = subprocess.run([PYTHON, "-c", check], env=env, capture_output=True, text=True, timeout=60)
        assert run.stdout.strip() == "42", (path, run.stderr)
        assert run.stderr.count("self-chaining ran") == run.stderr.count("user sitecustomize ran") == 1, run.stderr


def test_a_probe_made_block_in_a_package_chains_on_and_ends(tmp_path: Path) -> None:
    # A probe-made file copied into a package's __init__.py: the chain skips it by the sys.path
    # entry it came from (the package's folder is none), runs the user's file, and ends.
    ours, package, user = tmp_path / "ours", tmp_path / "pkg", tmp_path / "user"
    assert install(ours, payload()).code == 0
    (package / "sitecustomize").mkdir(parents=True)
    (package / "sitecustomize" / "__init__.py").write_text((ours / "sitecustomize.py").read_text())
    user.mkdir()
    (user / "sitecustomize.py").write_text(USER_SITE)
    env = offline_env(None, PYTHONPATH=f"{ours}:{package}:{user}")
    run = subprocess.run([PYTHON, "-c", CHECK], env=env, capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "True"
    assert run.stderr.count("user sitecustomize ran") == 1


def test_install_appends_to_an_existing_sitecustomize_idempotently(tmp_path: Path) -> None:
    site = tmp_path / "sitecustomize.py"
    site.write_text(USER_SITE)
    assert "appended" in install(tmp_path, payload()).message
    once = site.read_text()
    assert once.startswith(USER_SITE) and once.count(SITECUSTOMIZE.end_line) == 1
    assert "nothing changed" in install(tmp_path, payload()).message
    assert site.read_text() == once
    run = subprocess.run([PYTHON, "-c", CHECK], env=offline_env(tmp_path), capture_output=True, text=True)
    assert run.stdout.strip() == "True" and "user sitecustomize ran" in run.stderr


# lm-eval's arguments after its entry point, and the --output_path lm-eval itself takes from them.
SPELLINGS = [
    (["--output_path", "/r"], "/r"),
    (["--output_path=/r"], "/r"),
    (["--output", "/r"], "/r"),  # argparse's prefix matching: unambiguous among lm-eval's options
    (["--output_p=/r"], "/r"),
    (["--out", "/r"], "/r"),
    (["--o", "/r"], "/r"),
    (["-o", "/r"], "/r"),
    (["-o/r"], "/r"),
    (["-o=/r"], "/r"),
    (["-so/r"], "/r"),  # -s (--log_samples) takes no value: argparse reads on into -o
    (["-o", "/a", "--tasks", "x", "--output", "/r"], "/r"),  # the last one wins
    (["--log_samples", "--output_path", "/r", "--tasks", "x"], "/r"),
    (["--tasks", "x"], None),
    (["--output-path", "/r"], None),  # lm-eval has no dashed spelling: it refuses this word
    (["--model_args", "output_path=/x"], None),
]
ENTRIES = [
    [PYTHON, "-m", "lm_eval"], [PYTHON, "-u", "-mlm_eval"], ["lm_eval"], ["/usr/bin/lm-eval", "run"],
    ["accelerate", "launch", "-m", "lm_eval"],
]  # fmt: skip


def real_output_path(arguments: list[str]) -> str | None:
    """What the lm-eval installed here (InferenceX's lm-eval (b315ef3), a release from 0.4.10 on, or
    the 0.4.9.2 release) takes as its output path."""
    try:
        from lm_eval._cli.harness import HarnessCLI

        parser = HarnessCLI()._subparsers.choices["run"]
    except ImportError:
        from lm_eval.__main__ import setup_parser

        parser = setup_parser()
    try:
        return parser.parse_known_args(arguments)[0].output_path
    except SystemExit:  # lm-eval refuses the command line: it writes nowhere
        return None


@pytest.mark.entry
@pytest.mark.parametrize(("arguments", "expected"), SPELLINGS)
def test_output_path_is_read_the_way_lm_eval_reads_it(arguments: list[str], expected: str | None) -> None:
    assert real_output_path(arguments) == expected
    for entry in ENTRIES:
        assert output_path_in([*entry, *arguments]) == expected, entry
        assert output_path_in([*entry, *arguments], lmeval_args.FALLBACK) == expected, entry  # without lm-eval


# Words the lm-evals' own parsers read differently: the table of the lm-eval installed here must
# decide. InferenceX's lm-eval (b315ef3) takes exactly one value after --cache_requests (0.4.13:
# one or none), none after --tasks (0.4.13: at least one) and has no --trackio_args (so --tr is
# --trust_remote_code there, ambiguous in 0.4.13); the 0.4.9.2 release is like b315ef3 in the first
# and the last. Read with 0.4.13's table, all three would be wrong for b315ef3, two for the release.
TABLE_DEPENDENT = [["--cache_requests", "-o", "/r"], ["--tasks", "-o", "/r"], ["--tr", "-o", "/r"]]


@pytest.mark.entry
@pytest.mark.parametrize("arguments", TABLE_DEPENDENT)
def test_output_path_is_read_with_the_installed_lm_evals_own_table(arguments: list[str]) -> None:
    for entry in ENTRIES:
        assert output_path_in([*entry, *arguments]) == real_output_path(arguments), entry


def test_the_fallback_table_is_lm_eval_0_4_13s_own() -> None:
    derived = lmeval_args.options_from_lm_eval()
    assert derived is not None
    if importlib.metadata.version("lm_eval") == "0.4.13":
        assert derived == lmeval_args.FALLBACK
    else:  # another release: its table differs, but never in how it reads the output path
        assert ("--output_path", "-o") in [strings for strings, _ in derived]


def ours(scratch: Path) -> list[Path]:
    """What eval-probe run made in the temporary directory ``scratch`` (lm-eval's own libraries,
    torch's compile cache for one, may leave files of their own there: not ours to judge)."""
    return sorted(p for p in scratch.iterdir() if p.name.startswith("eval-probe-"))


def eval_probe_run(tmp_path: Path, *command: str, **env: str) -> subprocess.CompletedProcess:
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    return subprocess.run(
        [PYTHON, "-m", "probe", "run", "--", *command],
        env=offline_env(None, TMPDIR=str(scratch), **env), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.entry
def test_run_end_to_end_with_real_lm_eval(sim, local_task, tmp_path: Path) -> None:
    server = sim("never_stop")
    output = tmp_path / "out"
    command = local_task.lm_eval_command(server.base_url, "sim", output, 2048, 16)
    where = command.index("--output_path")
    command[where : where + 2] = [f"-o{output}"]  # a spelling lm-eval accepts, and so must we
    run = eval_probe_run(tmp_path, *command)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"sidecar and results go to {output}" in run.stderr
    assert "summary: TRIPPED (non_terminating): 16/16" in run.stderr
    assert (output / contract.SIDECAR_NAME).exists()
    assert ours(tmp_path / "scratch") == []  # the temporary site dir is gone


def test_run_with_lm_evals_run_subcommand_and_a_prefix_of_output_path(sim, local_task, tmp_path: Path) -> None:
    """``lm-eval run ... --output DIR``: the subcommand form of InferenceX's lm-eval (b315ef3) and of
    0.4.10 on, through its console script where this environment has one, else ``-m lm_eval run``."""
    pytest.importorskip("lm_eval._cli.harness", reason="the 0.4.9.2 release has no subcommands")
    server = sim("never_stop")
    output = tmp_path / "out"
    arguments = local_task.lm_eval_command(server.base_url, "sim", output, 2048, 16)[3:]  # after -m lm_eval
    arguments[arguments.index("--output_path")] = "--output"  # a prefix lm-eval accepts, and so must we
    script = Path(PYTHON).parent / "lm-eval"
    entry = [str(script)] if script.exists() else [PYTHON, "-m", "lm_eval"]
    run = eval_probe_run(tmp_path, *entry, "run", *arguments)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"sidecar and results go to {output}" in run.stderr
    assert "summary: TRIPPED (non_terminating): 16/16" in run.stderr
    assert (output / contract.SIDECAR_NAME).exists()


def test_run_reports_what_it_observed_when_it_did_not_trip(sim, local_task, tmp_path: Path) -> None:
    server = sim("healthy")
    run = eval_probe_run(tmp_path, *local_task.lm_eval_command(server.base_url, "sim", tmp_path / "out", 2048, 8))
    assert run.returncode == 0
    assert "the probe did not trip: 0 of 40 generations observed were cut off" in run.stderr
    assert "of 1 evaluation(s)" in run.stderr


def test_run_never_reports_a_leftover_sidecar_as_this_runs_trip(sim, local_task, tmp_path: Path) -> None:
    output = tmp_path / "out"
    output.mkdir()
    leftover = {"schema_version": 1, "verdict": {
        "tripped": True, "pathology": "non_terminating", "observations": 16, "pathological": 16,
        "finish_reasons": {"length": 16}, "max_tokens": [2048], "settings": {}, "tripped_at": time.time() - 60,
        "run_id": "a" * 32 + ".1"}, "final": None}  # fmt: skip
    (output / contract.SIDECAR_NAME).write_text(json.dumps(leftover))
    server = sim("mixed", cap_fraction=0.3)
    run = eval_probe_run(tmp_path, *local_task.lm_eval_command(server.base_url, "sim", output, 2048, 8))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "TRIPPED" not in run.stderr and "is another run's, not this one's" in run.stderr
    assert "the probe did not trip" in run.stderr and "most cut off: " in run.stderr


@pytest.mark.release_independent  # eval-probe run's summary; lm-eval only makes the trips
def test_a_trip_whose_record_the_command_put_elsewhere_is_still_a_trip(sim, local_task, tmp_path: Path) -> None:
    """A command that names its own RESULT_DIR puts the trip record there, not in the directory
    `eval-probe run` gave it: the summary says TRIPPED and where the record is, never 'did not trip'."""
    server = sim("never_stop")
    elsewhere = tmp_path / "elsewhere"
    lm_eval = local_task.lm_eval_command(server.base_url, "sim", tmp_path / "out", 2048, 16)
    run = eval_probe_run(tmp_path, "env", f"RESULT_DIR={elsewhere}", *lm_eval)
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stderr.splitlines() if "summary:" in line]
    sidecar = elsewhere / contract.SIDECAR_NAME
    assert json.loads(sidecar.read_text())["verdict"]["tripped"] is True
    assert "did not trip" not in line
    assert "summary: TRIPPED in 1 of 1 evaluation(s), whose trip record is not in " in line, line
    assert f": {sidecar}. Next: eval-probe read {elsewhere}" in line, line


@pytest.mark.release_independent  # eval-probe run's summary; lm-eval only makes the trips
def test_a_second_trip_whose_record_is_elsewhere_is_named_beside_the_first(sim, local_task, tmp_path: Path) -> None:
    """Two evaluations trip, one into the run's results directory, one into a RESULT_DIR of its own:
    the summary names both trip records, and where to read each."""
    server = sim("never_stop")
    output, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    first, second = (local_task.lm_eval_command(server.base_url, "sim", at, 2048, 16) for at in (elsewhere, output))
    both = f"{shlex.join(['env', f'RESULT_DIR={elsewhere}', *first])} && {shlex.join(second)}"
    command = [PYTHON, "-m", "probe", "run", "--result-dir", str(output), "--", "bash", "-c", both]
    run = subprocess.run(command, env=offline_env(None), capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stderr.splitlines() if "summary:" in line]
    assert "summary: TRIPPED (non_terminating)" in line and f"Sidecar: {output / contract.SIDECAR_NAME}" in line, line
    assert f"Tripped too, its trip record elsewhere: {elsewhere / contract.SIDECAR_NAME}" in line, line
    assert line.endswith(f"Next: eval-probe read {output}; eval-probe read {elsewhere}"), line


def test_the_summary_names_each_trip_record_once_and_only_paths(tmp_path: Path) -> None:
    """The report is a file any process may write: a record named twice (once through a link), or
    by no path (a number, a NUL), never crashes the summary nor is listed as a place to read."""

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "link").symlink_to(elsewhere, target_is_directory=True)
    named = [str(elsewhere / contract.SIDECAR_NAME), str(tmp_path / "link" / contract.SIDECAR_NAME), 7, "a\0b", ""]
    report = tmp_path / "observed.json"
    evaluations = [{"tripped": True, "sidecar": path, "groups": [], "tasks": {}} for path in named]
    report.write_text(json.dumps({"schema_version": 1, "evaluations": evaluations}))
    line = summary(tmp_path / "results", report)
    assert line.startswith("summary: TRIPPED in 5 of 5 evaluation(s)"), line
    assert line.count(contract.SIDECAR_NAME) == 1 and line.count("eval-probe read") == 1, line


NOT_AS_WRITTEN = "summary: not known: no evaluation in the probe's report "
NOT_READ = "summary: not known: the probe's report "
GROUP = {"tripped": False, "observations": 3, "pathological": 1}
# An evaluation as the probe writes it, healthy: each case below breaks one thing in it.
TASK = figures(observations=3, finish_reasons={"stop": 2, "length": 1}, cut_off=1, causes={"output_cap": 1},
               cut_off_rate=0.333333)  # fmt: skip
EVALUATION = {"schema_version": 1, "tripped": False, "groups": [GROUP], "tasks": {"t": TASK}, "unattributed": None}


@pytest.mark.parametrize(
    ("report", "expected"),
    [({"evaluations": [{"tripped": True, "sidecar": "/r/x.json", "groups": None, "tasks": []}]},
      "summary: TRIPPED in 1 of 1 evaluation(s), the probe's report says, but no trip record of theirs is found "
      "now (it was written to /r/x.json, and has been moved or removed)"),
     ({"evaluations": [{"tripped": True, "sidecar": "/r/x.json\nsummary: the probe did not trip", "groups": []}]},
      "(written by another process of the run). Next: eval-probe read its results directory"),
     ({"evaluations": [{**EVALUATION, "tasks": {"t": {**TASK, "cut_off_rate": "high"}}}]}, NOT_AS_WRITTEN),
     ({"evaluations": [{**EVALUATION, "tasks": {"t": {**TASK, "cut_off_rate": 10**400}}}]}, NOT_AS_WRITTEN),
     ({"evaluations": [{**EVALUATION, "groups": [GROUP, {**GROUP, "observations": 10**4000}]}]},
      NOT_AS_WRITTEN),
     ({"evaluations": [{**EVALUATION, "groups": [{**GROUP, "tripped": True}]}]}, NOT_AS_WRITTEN),
     ({"evaluations": [{**EVALUATION, "tasks": {"t": {**TASK, "tripped": True}}}]},
      NOT_AS_WRITTEN),
     ({"evaluations": [{**EVALUATION, "tripped": 1}]}, NOT_AS_WRITTEN),
     ({"evaluations": [{**EVALUATION, "tasks": {"a\x1b[2Kb": TASK}}]},
      NOT_AS_WRITTEN),
     ('{"schema_version": 1, "evaluations": [{"tripped": true, "tripped": false, "groups": [], "tasks": {}}]}',
      NOT_READ),
     ({"evaluations": [{"tripped": False, "groups": [], "tasks": {}}, ["tripped", True]]}, NOT_READ),
     ({"evaluations": [{**EVALUATION, "unattributed": {**TASK, "tripped": True}}]},
      NOT_AS_WRITTEN),
     ({"evaluations": [{**EVALUATION, "groups": [{**GROUP, "pathological": 999}]}]}, NOT_AS_WRITTEN),
     ({"evaluations": [{**EVALUATION, "tasks": {"t": {**TASK, "cut_off": 9}}}]},
      NOT_AS_WRITTEN),
     ("[" * 200_000, NOT_READ), (b"\xff\xfe not UTF-8", NOT_READ),
     # As the probe writes it: lm-eval's requests of no task it can tell count too.
     ({"evaluations": [{**EVALUATION, "tasks": {}, "unattributed": figures(
         observations=6, finish_reasons={"length": 6}, cut_off=6, causes={"output_cap": 6}, cut_off_rate=1.0,
         below_min_max_tokens=6, max_tokens=[8])}]},
      "the probe did not trip: 1 of 3 generations observed were cut off, in 1 group(s) of generation settings of "
      "1 evaluation(s); 6 more observed under a budget the rule does not judge")],
    ids=["tripped-groups-malformed", "newline-in-path", "rate-not-a-number", "rate-too-large", "count-too-large",
         "group-tripped-evaluation-not", "task-tripped-evaluation-not", "tripped-not-a-boolean",
         "escape-in-task-name", "key-twice", "an-evaluation-not-an-object", "unattributed-tripped-evaluation-not",
         "more-pathological-than-observed", "more-cut-off-than-observed", "nested-too-deep", "not-utf-8",
         "unattributed-counted"],
)  # fmt: skip
def test_the_summary_reads_any_report_without_crashing_or_hiding_a_trip(tmp_path: Path, report, expected) -> None:
    """The report is a file any process of the command may write: the summary says what it can tell
    (a trip stays a trip), never crashes (eval-probe run would lose the command's exit code) and
    never prints a text that would forge a line of its own."""

    path = tmp_path / "observed.json"
    if isinstance(report, bytes):
        path.write_bytes(report)
    else:
        path.write_text(report if isinstance(report, str) else json.dumps({"schema_version": 1, **report}))
    line = summary(tmp_path / "results", path)
    assert expected in line and "\n" not in line, line


def test_run_passes_the_exit_code_through_and_removes_an_empty_results_directory(tmp_path: Path) -> None:
    run = eval_probe_run(tmp_path, PYTHON, "-c", "import sys, os; print(os.environ['RESULT_DIR']); sys.exit(3)")
    assert run.returncode == 3
    assert Path(run.stdout.strip()).parent == tmp_path / "scratch"  # no --output_path: a new directory
    assert ours(tmp_path / "scratch") == []  # nothing was written there: it is gone


def test_a_results_directory_that_holds_something_is_kept_and_named(tmp_path: Path) -> None:
    write = "import os, pathlib; pathlib.Path(os.environ['RESULT_DIR'], 'note.txt').write_text('x')"
    run = eval_probe_run(tmp_path, PYTHON, "-c", write)
    assert run.returncode == 0
    [kept] = ours(tmp_path / "scratch")
    assert (kept / "note.txt").read_text() == "x" and f"results kept in {kept}" in run.stderr


def test_a_command_that_cannot_start_leaves_nothing_behind(tmp_path: Path) -> None:
    run = eval_probe_run(tmp_path, str(tmp_path / "no-such-command"))
    assert run.returncode == 127 and "cannot start" in run.stderr
    assert ours(tmp_path / "scratch") == []


def started_runner(tmp_path: Path, child: str) -> tuple[subprocess.Popen, int]:
    """``eval-probe run`` of a Python child that prints its pid, then waits; returns both pids."""
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    runner = subprocess.Popen(
        [PYTHON, "-m", "probe", "run", "--result-dir", str(tmp_path / "r"), "--", PYTHON, "-c", child],
        env=offline_env(None, TMPDIR=str(scratch)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return runner, int(runner.stdout.readline())


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie nobody has reaped yet is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
def test_the_command_dies_with_a_killed_runner(tmp_path: Path) -> None:
    runner, child = started_runner(tmp_path, "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(120)")
    try:
        assert alive(child)
        runner.kill()  # SIGKILL: no handler of the runner's can run
        runner.wait(timeout=30)
        deadline = time.monotonic() + 5
        while alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child), "the command outlived eval-probe run"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_forwarded_sigterm_is_named_in_the_summary(tmp_path: Path) -> None:
    # The child has loaded lm-eval's API models (so the probe is installed) when SIGTERM ends it.
    child = "import os, time\nimport lm_eval.models.api_models\nprint(os.getpid(), flush=True)\ntime.sleep(120)"
    runner, _ = started_runner(tmp_path, child)
    runner.send_signal(signal.SIGTERM)
    _, err = runner.communicate(timeout=60)
    assert runner.returncode == 128 + signal.SIGTERM
    summary = next(line for line in err.splitlines() if line.startswith("[lm-eval-probe] summary:"))
    assert "ended by signal 15 (SIGTERM)" in summary and "did not trip" not in summary
    assert "no lm-eval API model ran" not in summary


def test_run_without_a_command_is_a_usage_error(tmp_path: Path) -> None:
    assert eval_probe_run(tmp_path).returncode == 64


def test_ctrl_c_reaches_the_child(tmp_path: Path) -> None:
    child = (
        "import sys, time\n"
        "print('ready', flush=True)\n"
        "try:\n    time.sleep(60)\n"
        "except KeyboardInterrupt:\n    print('child got Ctrl-C', flush=True)\n    sys.exit(130)\n"
    )
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = subprocess.Popen(
        [PYTHON, "-m", "probe", "run", "--result-dir", str(tmp_path / "r"), "--", PYTHON, "-c", child],
        env=offline_env(None, TMPDIR=str(scratch)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert "child got Ctrl-C" in out and proc.returncode == 130
    assert ours(scratch) == []


def test_report_knob_lists_every_group(tmp_path: Path, sim) -> None:
    report = tmp_path / "observed.json"
    script = (
        "import sys\nsys.path.insert(0, %r)\nfrom support.lm import completions, generate\n"
        "generate(completions(%r), 20)\n"
    )
    server = sim("healthy")
    site = tmp_path / "site"
    install(site, payload())
    code = script % (str(Path(__file__).parent), server.base_url)
    env = offline_env(site, HYPERLOOM_EVAL_PROBE_REPORT=str(report), RESULT_DIR=str(tmp_path))
    run = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    (observed,) = json.loads(report.read_text())["evaluations"]
    assert [(g["observations"], g["pathological"], g["tripped"]) for g in observed["groups"]] == [(20, 0, False)]


def test_body_command_prints_a_runnable_sitecustomize(tmp_path: Path) -> None:
    for flags, chained in (((), False), (("--standalone",), True)):
        site = tmp_path / f"site{len(flags)}"
        site.mkdir()
        printed = subprocess.run([PYTHON, "-m", "probe", "body", *flags], capture_output=True, text=True, check=True)
        assert (
            printed.stdout.startswith("# >>> lm-eval-probe sitecustomize ")
            and ("chain = r'''" in printed.stdout) is chained
        )
        (site / "sitecustomize.py").write_text(printed.stdout)
        run = subprocess.run([PYTHON, "-c", CHECK], env=offline_env(site), capture_output=True, text=True)
        assert run.stdout.strip() == "True" and run.stderr == ""


def test_install_through_a_symlinked_sitecustomize_keeps_the_link(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "sitecustomize.py").write_text(USER_SITE)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").symlink_to(real / "sitecustomize.py")
    assert install(site, payload()).code == 0
    assert (site / "sitecustomize.py").is_symlink()
    assert (real / "sitecustomize.py").read_text().startswith(USER_SITE)
    assert SITECUSTOMIZE.end_line in (real / "sitecustomize.py").read_text()
    assert sorted(p.name for p in site.iterdir()) == ["sitecustomize.py"]
    assert sorted(p.name for p in real.iterdir()) == ["sitecustomize.py"]


@pytest.mark.parametrize(
    "foreign",
    ['{"schema_version": 1, "evaluations": [{"tripped": true}, "junk"]}', '{"schema_version": 2, "evaluations": []}',
     '{"schema_version": 1, "schema_version": 1, "evaluations": [{"tripped": true}]}', ""],
    ids=["an-entry-not-an-object", "another-schema", "a-key-twice", "empty"],
)  # fmt: skip
def test_a_process_never_replaces_a_report_it_cannot_read(tmp_path: Path, foreign: str) -> None:
    """Another process's report that this one cannot read may hold a trip: it is left as it is (the
    summary then says it cannot tell), never replaced by this process's evaluations alone."""
    from probe.runtime.scope.report import add_to_report, read_report

    path = tmp_path / "observed.json"
    path.write_text(foreign)
    with pytest.raises(OSError, match="not a report this probe writes; it is left as it is"):
        add_to_report(str(path), [{"tripped": False, "groups": [], "tasks": {}}])
    assert path.read_text() == foreign
    add_to_report(str(tmp_path / "new.json"), [{"tripped": True}])
    add_to_report(str(tmp_path / "new.json"), [{"tripped": False}])  # a second process appends
    assert [e["tripped"] for e in read_report(str(tmp_path / "new.json"))] == [True, False]


@pytest.mark.release_independent
def test_a_command_that_removes_its_results_directory_keeps_its_exit_code(tmp_path: Path) -> None:
    # As InferenceX's staging does: the command moves its results away and removes the directory.
    run = eval_probe_run(tmp_path, "bash", "-c", 'rm -rf "$RESULT_DIR"')
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "summary: " in run.stderr


@pytest.mark.parametrize("flags", [["-I"], ["-E"], ["-W", "ignore", "-Iu"]])
def test_a_python_that_never_loads_the_probe_is_warned_about_and_never_called_watched(
    sim, local_task, tmp_path: Path, flags: list[str]
) -> None:
    server = sim("never_stop")
    command = local_task.lm_eval_command(server.base_url, "sim", tmp_path / "out", 2048, 8)
    run = eval_probe_run(tmp_path, command[0], *flags, *command[1:])
    assert run.returncode == 0, run.stderr[-2000:]
    assert "WARNING: -" in run.stderr and "the probe cannot load in that process" in run.stderr
    assert "summary: NOT WATCHED: the probe was active in no process of the command" in run.stderr
    assert "did not trip" not in run.stderr


def test_a_flagged_generation_that_ran_to_the_cap_is_cut_off(tmp_path: Path) -> None:
    # Hostile round 3: "0 of 10 generations observed were cut off, 10 more flagged" over answers
    # that all ran to the cap after their flag.
    report = tmp_path / "observed.json"
    (tmp_path / "observed.json.active").touch()
    task = figures(observations=10, finish_reasons={"length": 10}, cut_off=10, causes={"output_cap": 10},
                   cut_off_rate=1.0, flagged=10, flagged_endings={"length": 10})  # fmt: skip
    group = {"tripped": False, "observations": 10, "pathological": 10, "flagged": 10}
    evaluation = {"schema_version": 1, "tripped": False, "groups": [group], "tasks": {"t": task}, "unattributed": None}
    report.write_text(json.dumps({"schema_version": 1, "evaluations": [evaluation]}))
    line = summary(tmp_path / "results", report)
    assert "10 of 10 generations observed were cut off (10 of them flagged as looping first)" in line, line
    assert "more flagged" not in line


def test_a_trip_record_moved_aside_by_a_concurrent_run_is_still_this_commands(tmp_path: Path) -> None:
    # Two runs at once into one directory: the other one's record took the sidecar's name, and
    # this command's own now lies beside it. Before: its summary named the other one's as its own.
    results, report = tmp_path / "results", tmp_path / "observed.json"
    results.mkdir()
    mine, theirs = "a" * 32 + ".1", "b" * 32 + ".2"

    def record(run: str, pathology: str) -> str:
        return json.dumps({"schema_version": 1, "verdict": {
            "tripped": True, "pathology": pathology, "observations": 16, "pathological": 16,
            "finish_reasons": {"length": 16}, "max_tokens": [2048], "settings": {}, "tripped_at": time.time() - 5,
            "run_id": run}, "final": None})  # fmt: skip

    (results / contract.SIDECAR_NAME).write_text(record(theirs, "repetition"))
    moved = results / f"{contract.SIDECAR_NAME}.stale-{int(time.time())}"
    moved.write_text(record(mine, "non_terminating"))
    (tmp_path / "observed.json.active").write_text(mine + "\n")
    line = summary(results, report)
    assert line.startswith("summary: TRIPPED (non_terminating)") and f"Sidecar: {moved}" in line, line
    assert f"The sidecar {results / contract.SIDECAR_NAME} is another run's, not this one's" in line, line


@pytest.mark.parametrize(
    "notes",
    [
        ["0123abcd.42"],  # forged by the command: no record, no report
        ['{"tripping": "0123abcd.42", "sidecar": "/sys/kernel/hyperloom_eval_probe.json"}',
         '{"not_applied": "0123abcd.42"}'],  # the record could not be written: TRIP NOT APPLIED, then killed
    ],
)  # fmt: skip
def test_a_trip_noted_without_a_record_is_never_called_tripped(tmp_path: Path, notes: list[str]) -> None:
    # Hostile round 4: "TRIPPED in 1 evaluation(s) that ended before they reported" where nothing
    # was answered blank (a claim that failed, then a kill), or from one forged line.
    report = tmp_path / "observed.json"
    (tmp_path / "observed.json.active").write_text("".join(f"{line}\n" for line in notes))
    line = summary(tmp_path / "results", report)
    assert "TRIPPED" not in line and "did not trip" not in line, line


def test_what_a_path_holds_never_breaks_the_summary_line(tmp_path: Path) -> None:
    results = tmp_path / "out\nsummary: the probe did not trip\x1b[2K"
    line = summary(results, tmp_path / "observed.json", still_running=1)  # then it names the directory
    assert "\n" not in line and "\x1b" not in line and "out\\nsummary" in line, line


def test_a_killed_nested_eval_probe_run_still_tells_the_outer_one(sim, local_task, tmp_path: Path) -> None:
    # Hostile round 4: the inner run, killed (timeout -s KILL), never forwarded its report, and the
    # outer one said NOT WATCHED, calling the trip record another run's.
    server, output = sim("never_stop"), tmp_path / "out"
    lm_eval = shlex.join(local_task.lm_eval_command(server.base_url, "sim", output, 2048, 16))
    # The inner run outlives its lm-eval (a script's later step), and is killed there.
    inner = shlex.join([PYTHON, "-m", "probe", "run", "--", "bash", "-c", f"{lm_eval}; sleep 60"])
    done = shlex.quote(str(output))
    # Wherever the release puts its results file (b315ef3 records no model name: no model directory).
    script = (f"{inner} & pid=$!; for _ in $(seq 600); do [ -n \"$(find {done} -name 'results_*.json')\" ] && "
              "break; sleep 0.2; done; sleep 1; kill -KILL $pid; wait $pid")  # fmt: skip
    run = eval_probe_run(tmp_path, "bash", "-c", script)
    assert run.returncode == 128 + signal.SIGKILL, run.stderr[-3000:]
    [line] = [line for line in run.stderr.splitlines() if "summary:" in line]
    assert "summary: TRIPPED" in line and f"eval-probe read {output}" in line, line
    assert "another run's" not in line and "NOT WATCHED" not in line, line


@pytest.mark.parametrize("blocked", ["the output path's parent", "the model's directory"])
def test_a_save_that_failed_is_never_named_as_where_results_are(sim, local_task, tmp_path: Path, blocked: str) -> None:
    # lm-eval logs "Could not save results aggregated" and goes on: nothing is there to read.
    server = sim("healthy")
    if blocked == "the model's directory":  # lm-eval writes OUTPUT/<model>/results_<time>.json
        output = tmp_path / "out"
        output.mkdir()
        (output / "sim").write_text("not a directory")
    else:
        (tmp_path / "a-file").write_text("not a directory")
        output = tmp_path / "a-file" / "res"
    run = eval_probe_run(tmp_path, *local_task.lm_eval_command(server.base_url, "sim", output, 2048, 8))
    assert run.returncode == 0, run.stderr[-3000:]
    [line] = [line for line in run.stderr.splitlines() if "summary:" in line]
    assert "the probe did not trip" in line, line
    # What it names holds a results file (InferenceX's lm-eval makes no model directory, and saves).
    for named in re.findall(r"eval-probe read (\S+)", line):
        assert list(Path(named).rglob("results_*.json")), (named, line)


def test_the_summary_never_calls_a_flag_cut_off(tmp_path: Path) -> None:
    report, loaded = tmp_path / "observed.json", tmp_path / "observed.json.active"
    loaded.touch()
    task = figures(
        observations=64,
        finish_reasons={"stop": 64},
        cut_off=0,
        cut_off_rate=0.0,
        flagged=13,
        flagged_endings={"stop": 13},
    )
    group = {"tripped": False, "observations": 64, "pathological": 13, "flagged": 13}
    evaluation = {"schema_version": 1, "tripped": False, "groups": [group], "tasks": {"t": task}, "unattributed": None}
    report.write_text(json.dumps({"schema_version": 1, "evaluations": [evaluation]}))
    line = summary(tmp_path / "results", report)
    assert "0 of 64 generations observed were cut off, 13 more flagged as looping while they ran" in line, line


def test_a_trip_record_of_another_model_running_beside_it_is_not_this_commands(tmp_path: Path) -> None:
    # Two models run at once into one output path: the trip record there is the other one's.
    results, report = tmp_path / "results", tmp_path / "observed.json"
    results.mkdir()
    trip = {"schema_version": 1, "verdict": {
        "tripped": True, "pathology": "non_terminating", "observations": 16, "pathological": 16,
        "finish_reasons": {"length": 16}, "max_tokens": [2048], "settings": {}, "tripped_at": time.time(),
        "run_id": "b" * 32 + ".1"}, "final": None}  # fmt: skip
    (results / contract.SIDECAR_NAME).write_text(json.dumps(trip))
    task = figures(observations=16, finish_reasons={"stop": 16}, cut_off=0, cut_off_rate=0.0)
    mine = {"schema_version": 1, "tripped": False, "run_id": "a" * 32 + ".1", "unattributed": None,
            "groups": [{"tripped": False, "observations": 16, "pathological": 0}], "tasks": {"t": task}}  # fmt: skip
    report.write_text(json.dumps({"schema_version": 1, "evaluations": [mine]}))
    line = summary(results, report)
    assert "TRIPPED" not in line and "is another run's, not this one's" in line and "did not trip" in line, line


@pytest.mark.parametrize(
    ("command", "named"),
    [
        (["env", "-i", "lm_eval"], ["env -i"]),
        (["env", "-u", "PYTHONPATH", "python", "-m", "lm_eval"], ["env -u PYTHONPATH"]),
        (["env", "--unset=PYTHONPATH", "lm_eval"], ["env -u PYTHONPATH"]),
        (["env", "PYTHONPATH=/elsewhere", "lm_eval"], ["env PYTHONPATH=..."]),
        (["env", "-C", "/tmp", "-S", "python3 -I -m lm_eval"], ["-I"]),
        (["python", "--check-hash-based-pycs", "always", "-I", "-m", "lm_eval"], ["-I"]),
        (["python", "-W", "ignore", "-IS", "-m", "lm_eval"], ["-I", "-S"]),
        (["python", "-c", "-I"], []),  # code, not a flag
        (["python", "script.py", "-E"], []),  # the script's argument
        (["env", "A=1", "lm_eval", "-I"], []),  # lm_eval's argument
    ],
)
def test_what_keeps_the_probe_out_is_named_before_the_command_starts(command: list[str], named: list[str]) -> None:
    assert _unhooking_flags(command) == named


def test_env_that_unsets_pythonpath_is_warned_about_and_never_called_watched(tmp_path: Path) -> None:
    run = eval_probe_run(tmp_path, "env", "-u", "PYTHONPATH", PYTHON, "-c", "import lm_eval.evaluator")
    assert run.returncode == 0 and "WARNING: env -u PYTHONPATH keeps Python from reading PYTHONPATH" in run.stderr
    assert "summary: NOT WATCHED" in run.stderr and "did not trip" not in run.stderr, run.stderr[-2000:]


def test_a_helper_that_loads_the_probe_does_not_make_an_unwatched_evaluation_watched(
    sim, local_task, tmp_path: Path
) -> None:
    # A script asks lm-eval's version with a plain Python (the probe loads there), then evaluates under
    # python -I (it does not). Before: "the probe did not trip", over answers that all ran to the cap.
    server = sim("never_stop")
    command = local_task.lm_eval_command(server.base_url, "sim", tmp_path / "out", 2048, 8)
    script = f"{PYTHON} -c 'import lm_eval.evaluator' && {shlex.join([command[0], '-I', *command[1:]])}"
    run = eval_probe_run(tmp_path, "bash", "-c", script)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "summary: NOT WATCHED to its end: lm-eval loaded the probe" in run.stderr
    assert "did not trip" not in run.stderr


@pytest.mark.release_independent
def test_a_command_that_puts_a_file_where_its_results_directory_was_is_told_where_it_is(tmp_path: Path) -> None:
    run = eval_probe_run(tmp_path, "bash", "-c", 'rmdir "$RESULT_DIR" && echo results > "$RESULT_DIR"')
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stderr[-2000:]
    [kept] = [p for p in (tmp_path / "scratch").iterdir() if p.name.startswith("eval-probe-results-")]
    assert kept.read_text() == "results\n" and f"results kept in {kept}" in run.stderr


def test_python_without_its_site_is_warned_about_too(tmp_path: Path) -> None:
    run = eval_probe_run(tmp_path, PYTHON, "-S", "-c", "pass")
    assert run.returncode == 0 and "WARNING: -S keeps Python from reading PYTHONPATH" in run.stderr
    assert "summary: NOT WATCHED" in run.stderr


def test_two_evaluations_that_both_trip_into_one_directory_are_both_reported(sim, local_task, tmp_path: Path) -> None:
    server, output = sim("never_stop"), tmp_path / "out"
    command = shlex.join(local_task.lm_eval_command(server.base_url, "sim", output, 2048, 8))
    run = subprocess.run([PYTHON, "-m", "probe", "run", "--result-dir", str(output), "--", "bash", "-c",
                          f"{command} && {command}"], env=offline_env(None), capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    blank = [json.loads(p.read_text())[contract.EVIDENCE_KEY] for p in sorted(output.rglob("results_*.json"))]
    assert len(blank) == 2 and all(e["tripped"] for e in blank)
    total = sum(f["short_circuited"] for e in blank for f in e["tasks"].values())
    assert f"{total} (in 2 of 2 evaluations) requests short-circuited" in run.stderr, run.stderr[-2000:]
    assert len(list(output.glob(contract.SIDECAR_NAME + ".stale-*"))) == 1  # the first record, moved aside


def test_two_trips_of_different_causes_in_one_directory_are_each_named_with_their_advice(
    sim, local_task, tmp_path: Path
) -> None:
    # Hostile round 3: the summary gave the second trip's cause and advice only, and never named
    # the first one's record, moved aside.
    capped, looping, output = sim("never_stop"), sim("repetition"), tmp_path / "out"
    first, second = (
        shlex.join(local_task.lm_eval_command(s.base_url, "sim", output, 2048, 8)) for s in (capped, looping)
    )
    run = subprocess.run([PYTHON, "-m", "probe", "run", "--result-dir", str(output), "--", "bash", "-c",
                          f"{first} && {second}"], env=offline_env(None), capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stderr.splitlines() if "summary:" in line]
    [moved] = output.glob(contract.SIDECAR_NAME + ".stale-*")
    cap_advice, loop_advice = (contract.cause_words(c)[1] for c in (contract.OUTPUT_CAP, contract.REPETITION))
    assert f"Tripped too, its trip record elsewhere: {moved}" in line and cap_advice in line, line
    assert f"Sidecar: {output / contract.SIDECAR_NAME}" in line and loop_advice in line, line


def test_a_nested_eval_probe_run_tells_the_outer_one_what_it_watched(sim, local_task, tmp_path: Path) -> None:
    # A script that calls eval-probe run itself, run under eval-probe run: the outer summary said
    # NOT WATCHED over a run the inner one saw trip.
    server = sim("never_stop")
    inner = [PYTHON, "-m", "probe", "run", "--", *local_task.lm_eval_command(server.base_url, "sim", tmp_path / "out",
                                                                              2048, 16)]  # fmt: skip
    run = eval_probe_run(tmp_path, *inner)
    assert run.returncode == 0, run.stderr[-3000:]
    summaries = [line for line in run.stderr.splitlines() if "summary:" in line]
    assert len(summaries) == 2 and all("summary: TRIPPED (non_terminating): 16/16" in s for s in summaries), summaries


def test_a_command_run_with_the_probe_switched_off_is_told_so(sim, local_task, tmp_path: Path) -> None:
    server = sim("never_stop")
    run = eval_probe_run(tmp_path, *local_task.lm_eval_command(server.base_url, "sim", tmp_path / "out", 2048, 8),
                         HYPERLOOM_EVAL_PROBE="0")  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "probe switched off (HYPERLOOM_EVAL_PROBE=0)" in run.stderr and "probe active" not in run.stderr
    assert "summary: NOT WATCHED: the probe was switched off (HYPERLOOM_EVAL_PROBE=0)" in run.stderr


@pytest.mark.parametrize("spelling", ["res.json/", "sub/.json"])
def test_the_directory_named_is_where_lm_eval_writes_however_the_path_is_spelt(
    sim, local_task, tmp_path: Path, spelling: str
) -> None:
    # lm-eval asks pathlib: "res.json/" is a .json path (res_<time>.json beside it), ".json" is a directory.
    server = sim("healthy")
    output = f"{tmp_path / 'o'}/{spelling}"
    run = eval_probe_run(tmp_path, *local_task.lm_eval_command(server.base_url, "sim", output, 2048, 8))
    assert run.returncode == 0, run.stderr[-3000:]
    [results] = Path(tmp_path / "o").rglob("res*.json") if spelling == "res.json/" else (tmp_path / "o").rglob(
        "results_*.json")  # fmt: skip
    read_from = tmp_path / "o" if spelling == "res.json/" else tmp_path / "o" / "sub" / ".json"
    assert f"sidecar and results go to {read_from}" in run.stderr, run.stderr[-2000:]
    assert read_from in results.parents
    verdict = subprocess.run([PYTHON, "-m", "probe", "read", str(read_from)], capture_output=True, text=True)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr


def test_the_summary_names_where_lm_eval_saved_when_the_command_line_does_not_say(
    sim, local_task, tmp_path: Path
) -> None:
    # The output path hidden in a script, and a --result-dir that is not lm-eval's output path:
    # the summary names where lm-eval really wrote (the probe notes it as lm-eval saves).
    server, output, records = sim("never_stop"), tmp_path / "out", tmp_path / "records"
    script = shlex.join(local_task.lm_eval_command(server.base_url, "sim", output, 2048, 16))
    run = subprocess.run([PYTHON, "-m", "probe", "run", "--result-dir", str(records), "--", "bash", "-c", script],
                         env=offline_env(None), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stderr.splitlines() if "summary:" in line]
    assert line.endswith(f"Next: eval-probe read {records}; eval-probe read {output}"), line
    direct = eval_probe_run(tmp_path, *local_task.lm_eval_command(server.base_url, "sim", output, 2048, 16))
    assert f"probe active; sidecar and results go to {output}" in direct.stderr
    both = subprocess.run([PYTHON, "-m", "probe", "run", "--result-dir", str(records), "--", *shlex.split(script)],
                          env=offline_env(None), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert f"probe active; its sidecar goes to {records}, lm-eval's results to {output}" in both.stderr


def test_the_directory_named_is_where_lm_eval_writes_for_a_json_path_and_a_config(tmp_path: Path) -> None:
    from probe.lmeval_args import FALLBACK, results_dir_of

    config = tmp_path / "cfg.yaml"
    config.write_text(f"output_path: {tmp_path / 'from-config'}\n")
    assert results_dir_of(["lm_eval", "--output_path", str(tmp_path / "res.json")]) == str(tmp_path)
    assert results_dir_of(["lm_eval", "--output_path", "res.json"]) == "."
    # lm-eval run --config (0.4.10 on: 0.4.13's table)
    assert results_dir_of(["lm-eval", "run", "--config", str(config)], FALLBACK) == str(tmp_path / "from-config")
    assert results_dir_of(["lm-eval", "run", "--config", str(tmp_path / "missing.yaml")], FALLBACK) is None


@pytest.mark.entry
def test_run_with_a_json_output_path_names_and_reads_where_lm_eval_wrote(sim, local_task, tmp_path: Path) -> None:
    server, output = sim("never_stop"), tmp_path / "out"
    run = eval_probe_run(tmp_path, *local_task.lm_eval_command(server.base_url, "sim", output / "res.json", 2048, 16))
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"sidecar and results go to {output}\n" in run.stderr and not (output / "res.json").is_dir()
    assert (output / contract.SIDECAR_NAME).exists() and f"Next: eval-probe read {output}" in run.stderr


def test_a_trip_whose_process_was_killed_stays_the_commands_own(sim, local_task, tmp_path: Path) -> None:
    # A CI step's timeout kills the tripped lm-eval before it reports; a healthy one runs after it.
    never, healthy, output = sim("never_stop"), sim("healthy"), tmp_path / "out"
    first = shlex.join(local_task.lm_eval_command(never.base_url, "sim", output, 2048, 8))
    second = shlex.join(local_task.lm_eval_command(healthy.base_url, "sim", output, 2048, 8))
    sidecar = shlex.quote(str(output / contract.SIDECAR_NAME))
    script = (f"{first} & pid=$!; until [ -e {sidecar} ]; do sleep 0.1; done; kill -9 $pid; wait $pid; "
              f"{second}")  # fmt: skip
    run = subprocess.run([PYTHON, "-m", "probe", "run", "--result-dir", str(output), "--", "bash", "-c", script],
                         env=offline_env(None), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "summary: TRIPPED (non_terminating)" in run.stderr and "another run's" not in run.stderr, run.stderr[-1500:]


# Evaluations of a command: (run id, tripped, reported), each run id once.
EVALUATED = st.lists(st.tuples(st.integers(0, 3), st.booleans(), st.booleans()), max_size=4, unique_by=lambda r: r[0])


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(EVALUATED, st.sampled_from([None, 0, 1, 2, 3, 9]), st.booleans())
def test_a_summary_speaks_only_for_the_commands_own_evaluations(tmp_path: Path, runs, sidecar_of, before) -> None:
    """Over generated commands: evaluations (run ids 0-3), each tripped or not, each reported or
    killed before it reported (a trip is noted before its record is written), and a trip record
    in the results directory of one of them, of another run (9), or none. The summary says
    TRIPPED for the directory's record exactly when the record is one of the command's own, and
    never "did not trip" when one of its evaluations tripped."""
    import shutil

    root = tmp_path / "case"
    shutil.rmtree(root, ignore_errors=True)
    results, report = root / "results", root / "observed.json"
    results.mkdir(parents=True)
    started, evaluations = time.time() - 100, []
    ids = {i: f"{i:032x}.{i + 7}" for i in range(10)}
    with open(f"{report}.active", "a") as noted:
        for i, tripped, reported in runs:
            if tripped:
                noted.write(ids[i] + "\n")
            if reported:
                group = {"tripped": tripped, "observations": 16, "pathological": 16 if tripped else 0}
                task = figures(observations=16, tripped=tripped) if not tripped else figures(
                    observations=16, finish_reasons={"length": 16}, cut_off=16, causes={"output_cap": 16},
                    cut_off_rate=1.0, short_circuited=24, tripped=True)  # fmt: skip
                evaluations.append({"schema_version": 1, "tripped": tripped, "run_id": ids[i], "unattributed": None,
                                    "sidecar": str(results / contract.SIDECAR_NAME) if tripped else None,
                                    "groups": [group], "tasks": {"t": task}})  # fmt: skip
    if evaluations:
        report.write_text(json.dumps({"schema_version": 1, "evaluations": evaluations}))
    if sidecar_of is not None:
        record = {"schema_version": 1, "verdict": {
            "tripped": True, "pathology": "non_terminating", "observations": 16, "pathological": 16,
            "finish_reasons": {"length": 16}, "max_tokens": [2048], "settings": {},
            "tripped_at": started - 50 if before else started + 10, "run_id": ids[sidecar_of]},
            "final": None}  # fmt: skip
        (results / contract.SIDECAR_NAME).write_text(json.dumps(record))
    line = summary(results, report)
    own = {ids[i] for i, tripped, _ in runs if tripped} | {ids[i] for i, _, reported in runs if reported}
    record_is_ours = sidecar_of is not None and ids[sidecar_of] in own
    assert line.startswith("summary: TRIPPED (") == record_is_ours, (line, runs, sidecar_of, before)
    if any(tripped for _, tripped, _ in runs):
        assert "did not trip" not in line and "NOT WATCHED" not in line, (line, runs, sidecar_of, before)
