"""`eval-probe install DIR`: what Python will really import from DIR, the new file's mode, and a DIR
that does not exist yet."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
from pathlib import Path

import pytest
from support.procs import PYTHON

from patcher import errors
from patcher.safewrite import new_file_mode
from probe.demo.localtask import offline_env

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

WHICH = "import sitecustomize; print(sitecustomize.__file__)"


def eval_probe_install(directory: Path, umask: int | None = None) -> subprocess.CompletedProcess:
    command = [PYTHON, "-m", "probe", "install", str(directory)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, umask=-1 if umask is None else umask)


def imported_from(directory: Path) -> str:
    """The file Python imports as sitecustomize with ``directory`` first on PYTHONPATH."""
    run = subprocess.run([PYTHON, "-c", WHICH], env=offline_env(directory), capture_output=True, text=True)
    return run.stdout.strip()


@pytest.mark.parametrize(
    "shadow",
    [
        "sitecustomize/__init__.py",  # a regular package
        f"sitecustomize{importlib.machinery.EXTENSION_SUFFIXES[0]}",  # an extension module (any bytes)
    ],
)
def test_what_would_be_imported_instead_is_refused_and_nothing_written(tmp_path: Path, shadow: str) -> None:
    site = tmp_path / "site"
    (site / shadow).parent.mkdir(parents=True, exist_ok=True)
    (site / shadow).write_text("SHADOW = True\n")
    before = sorted(p.relative_to(site) for p in site.rglob("*"))
    run = eval_probe_install(site)
    assert run.returncode == errors.FILE_PROBLEM, run.stdout + run.stderr
    assert "Python imports this as sitecustomize" in run.stderr and str(site / shadow.split("/")[0]) in run.stderr
    assert sorted(p.relative_to(site) for p in site.rglob("*")) == before


def test_a_directory_named_sitecustomize_without_init_does_not_shadow(tmp_path: Path) -> None:
    # A namespace portion: the module wins over it, so the probe does load.
    site = tmp_path / "site"
    (site / "sitecustomize").mkdir(parents=True)
    assert eval_probe_install(site).returncode == 0
    assert imported_from(site) == str(site / "sitecustomize.py")


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_a_new_sitecustomize_gets_an_ordinary_files_mode(tmp_path: Path, umask: int) -> None:
    site = tmp_path / "site"
    site.mkdir()
    assert eval_probe_install(site, umask).returncode == 0
    assert (site / "sitecustomize.py").stat().st_mode & 0o777 == 0o666 & ~umask
    ordinary = tmp_path / "ordinary"
    subprocess.run([PYTHON, "-c", f"open({str(ordinary)!r}, 'w')"], check=True, umask=umask)
    assert (site / "sitecustomize.py").stat().st_mode & 0o777 == ordinary.stat().st_mode & 0o777


def test_new_file_mode_follows_the_umask_without_changing_it() -> None:
    mask = os.umask(0o027)
    try:
        assert new_file_mode() == 0o640
        assert os.umask(0o027) == 0o027  # still what it was
    finally:
        os.umask(mask)


def test_a_missing_directory_is_created_when_its_parent_exists(tmp_path: Path) -> None:
    site = tmp_path / "new"
    run = eval_probe_install(site)
    assert run.returncode == 0 and f"{site} created" in run.stdout
    assert imported_from(site) == str(site / "sitecustomize.py")


def test_a_missing_parent_is_a_file_problem_and_creates_nothing(tmp_path: Path) -> None:
    site = tmp_path / "typo" / "site"
    run = eval_probe_install(site)
    assert run.returncode == errors.FILE_PROBLEM and "no such directory" in run.stderr
    assert not (tmp_path / "typo").exists()


def test_a_file_where_the_directory_should_be_is_a_file_problem(tmp_path: Path) -> None:
    (tmp_path / "site").write_text("x")
    run = eval_probe_install(tmp_path / "site")
    assert run.returncode == errors.FILE_PROBLEM and "not a directory" in run.stderr
    assert (tmp_path / "site").read_text() == "x"


def test_an_extension_module_built_for_another_python_is_refused_too(tmp_path: Path) -> None:
    # eval-probe may run on another Python than the lm-eval that will import DIR (pipx, a container's
    # interpreter): a module built for that one shadows the file there. Before: written, exit 0.
    site = tmp_path / "site"
    site.mkdir()
    other = site / "sitecustomize.cpython-399-x86_64-linux-gnu.so"
    other.write_bytes(b"\x7fELF")
    run = eval_probe_install(site)
    assert run.returncode == errors.FILE_PROBLEM and str(other) in run.stderr, run.stdout + run.stderr
    assert sorted(site.iterdir()) == [other]
    other.rename(site / "sitecustomize.cpython-399-x86_64-linux-gnu.so.bak")  # not a name Python imports
    assert eval_probe_install(site).returncode == 0
