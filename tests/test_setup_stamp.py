"""scripts/setup.sh remakes an environment when what it would install changes, pyproject.toml's
requirements included, and only then.

setup.sh runs for real, in a copy of the tree, with PYTHON set to a stand-in interpreter that makes
an empty environment and records each `pip install` instead of installing (real installs take
minutes); every other use of Python goes to the real one."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from support.procs import PYTHON

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh).
pytestmark = pytest.mark.release_independent

ROOT = Path(__file__).resolve().parents[1]
STAND_IN = """#!/usr/bin/env bash
case "$1 $2" in
    "-m venv") mkdir -p "$3/bin" && ln -s "$STAND_IN" "$3/bin/python" ;;
    "-m pip") echo "pip $*" >> "$PIP_LOG" ;;
    *) exec "$REAL_PYTHON" "$@" ;;
esac
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "setup.sh", root / "scripts" / "setup.sh")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    stand_in = tmp_path / "python"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    return root


def setup_main(tree: Path) -> str:
    """Run ``scripts/setup.sh main`` in ``tree``; what it printed."""
    stand_in = tree.parent / "python"
    env = {
        **os.environ, "PYTHON": str(stand_in), "STAND_IN": str(stand_in), "REAL_PYTHON": PYTHON,
        "PIP_LOG": str(tree.parent / "pip.log"),
    }  # fmt: skip
    run = subprocess.run(["bash", "scripts/setup.sh", "main"], cwd=tree, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_a_new_requirement_in_pyproject_remakes_the_environment(tree: Path) -> None:
    assert "making .venv" in setup_main(tree)
    assert "is up to date" in setup_main(tree)
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text.replace('    "pytest>=8",\n', '    "pytest>=8",\n    "pytest-timeout>=2",\n', 1))
    assert pyproject.read_text() != text  # the edit took
    assert "making .venv" in setup_main(tree)
    assert "is up to date" in setup_main(tree)


def test_what_pip_does_not_see_changes_nothing(tree: Path) -> None:
    setup_main(tree)
    pyproject = tree / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("line-length = 120", "line-length = 100"))
    assert "is up to date" in setup_main(tree)
