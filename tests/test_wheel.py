"""The wheel `pip install .` builds: it holds the whole tree, and every command runs from it, installed
(not editable) into a fresh virtual environment without lm-eval."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.procs import PYTHON
from support.resultfiles import write_results

from probe import exitcodes
from probe.cli import build_parser

# Does not depend on the lm-eval release (the environment it builds has none): run once.
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("probe", "patcher")
# What a build reads besides the packages (pyproject.toml names README.md as the readme).
BUILD_INPUTS = ("pyproject.toml", "README.md")
# What running the code leaves in the packages: never part of the project.
LEFTOVERS = ("__pycache__", "*.pyc")
FIXTURES = Path(__file__).parent / "fixtures"


def tree_files() -> set[str]:
    """Every file of the installable packages in the source tree, relative to the root."""
    return {
        p.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for p in (ROOT / package).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel pip builds from a copy of the tree (a build writes into the tree it builds)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns(*LEFTOVERS))
    for name in BUILD_INPUTS:
        shutil.copy(ROOT / name, source / name)
    build = subprocess.run(
        [PYTHON, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(work), str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    [built] = work.glob("lm_eval_probe-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment with the wheel installed (its dependencies from the index); its bin/."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    # The base interpreter, not this environment's: nothing of the test environment may leak in.
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=300)
    install = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check", "-q", str(wheel)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    return venv / "bin"


def in_env(bin_dir: Path, *command: str | Path, cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    """Run ``command`` from the environment, outside the source tree, without the caller's PYTHONPATH;
    ``extra`` goes into its environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_wheel_holds_every_file_of_the_packages(wheel: Path) -> None:
    # A property of the tree, not a list: a new module, subpackage or data file fails here until the
    # build includes it.
    names = {n for n in zipfile.ZipFile(wheel).namelist() if not n.split("/")[0].endswith(".dist-info")}
    assert names == tree_files()
    assert {"probe/runtime/hooking/bootstrap.py", "probe/reader/verdict.py", "probe/demo/simserver.py"} <= names


def test_every_command_runs_from_the_installed_wheel_without_lm_eval(installed: Path, tmp_path: Path) -> None:
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    where = in_env(installed, "python", "-c", "import probe, patcher; print(probe.__file__, patcher.__file__)", cwd=cwd)
    assert where.returncode == 0, where.stderr
    assert all(Path(p).is_relative_to(installed.parent) for p in where.stdout.split()), where.stdout
    assert in_env(installed, "python", "-c", "import lm_eval", cwd=cwd).returncode != 0  # the premise

    names = build_parser()._subparsers._group_actions[0].choices  # every command, as the parser has them
    for args in (["--version"], ["--help"], *([name, "--help"] for name in names)):
        shown = in_env(installed, "eval-probe", *args, cwd=cwd)
        assert shown.returncode == 0 and shown.stdout and not shown.stderr, (args, shown.stderr[-2000:])

    for flags in ([], ["--standalone"], ["--sources"]):
        body = in_env(installed, "eval-probe", "body", *flags, cwd=cwd)
        assert body.returncode == 0 and body.stdout, (flags, body.stderr[-2000:])

    site = tmp_path / "site"
    assert in_env(installed, "eval-probe", "install", site, cwd=cwd).returncode == 0
    imported = in_env(installed, "python", "-c", "import sitecustomize; print(sitecustomize.__file__)", cwd=cwd,
                      PYTHONPATH=str(site))  # fmt: skip
    assert imported.stdout.strip() == str(site / "sitecustomize.py") and not imported.stderr, imported.stderr
    started = in_env(installed, "eval-probe", "run", "--result-dir", tmp_path / "r", "--", "python", "-c",
                     "import sitecustomize; print(sitecustomize.__file__)", cwd=cwd)  # fmt: skip
    assert started.returncode == 0 and "summary:" in started.stderr, started.stderr[-2000:]
    assert Path(started.stdout.strip()).name == "sitecustomize.py" and "eval-probe-site-" in started.stdout

    shutil.copytree(FIXTURES / "file", tmp_path / "InferenceX")
    lib = tmp_path / "InferenceX" / "benchmarks" / "benchmark_lib.sh"
    for args, code in ((["--check"], 1), (["--dry-run"], 0), ([], 0), (["--check"], 0), (["--unpatch"], 0)):
        patched = in_env(installed, "eval-probe", "patch", *args, lib, cwd=cwd)
        assert patched.returncode == code, (args, patched.stdout, patched.stderr[-2000:])
    assert lib.read_bytes() == (FIXTURES / "file" / "benchmarks" / "benchmark_lib.sh").read_bytes()

    write_results(tmp_path / "out", 0.75)
    read = in_env(installed, "eval-probe", "read", tmp_path / "out", "--json", cwd=cwd)
    assert read.returncode == 0 and '"status": "ok"' in read.stdout, read.stderr[-2000:]

    demo = in_env(installed, "eval-probe", "demo", cwd=cwd)
    assert demo.returncode == exitcodes.DEMO_CANNOT_RUN and "lm-eval is not installed" in demo.stderr, demo.stderr
    assert "Traceback" not in demo.stderr
