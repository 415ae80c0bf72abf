"""`eval-probe patch` on benchmark_lib.sh fixtures of both InferenceX shapes."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from support.inferencex import FIXTURES
from support.procs import PYTHON, unprivileged

from patcher import benchlib, errors
from patcher.files import patch_file
from patcher.markers import PATCH
from probe.inject import body_digest, payload, sitecustomize_text
from probe.runtime.core import contract

# Does not depend on the lm-eval release: run once, against 0.4.13 (scripts/test.sh). The test
# that runs real lm-eval on a patched script is in test_inferencex_flow.py.
pytestmark = pytest.mark.release_independent


def eval_probe(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "probe", *args], capture_output=True, text=True, timeout=120, **kwargs)


def test_block_sits_before_the_anchor_with_the_terminator_at_column_zero(tree) -> None:
    assert patch_file(tree, payload()).code == 0
    lines = tree.read_text().splitlines()
    begin = next(i for i, line in enumerate(lines) if "# >>> lm-eval-probe patch " in line)
    end = lines.index("    " + PATCH.end_line)
    assert lines[begin + 1].strip().startswith("cat >> ") and lines[begin + 1].endswith(f"<<'{benchlib.DELIMITER}'")
    assert lines[end - 1] == benchlib.DELIMITER  # the terminator, at column 0
    assert lines[end + 1].strip().startswith("export PYTHONPATH=")
    assert f"v{contract.PROBE_VERSION} body={body_digest()}" in lines[begin]


def test_idempotent_upgrade_and_unpatch_round_trip(tree) -> None:
    original = tree.read_bytes()
    assert patch_file(tree, payload()).code == 0
    once = tree.read_bytes()
    assert "already patched" in patch_file(tree, payload()).message
    assert tree.read_bytes() == once
    # An older block (other version, other body) is replaced, not added to.
    old = benchlib.patch(original.decode(), "# an older probe body\n", "0.0.1", "0123456789abcdef")
    tree.write_text(old)
    assert eval_probe("patch", "--check", str(tree)).returncode == 1
    assert "upgraded from 0.0.1" in patch_file(tree, payload()).message
    assert tree.read_bytes() == once
    assert eval_probe("patch", "--check", str(tree)).returncode == 0
    assert eval_probe("patch", "--unpatch", str(tree)).returncode == 0
    assert tree.read_bytes() == original
    assert eval_probe("patch", "--check", str(tree)).returncode == 1


def test_dry_run_prints_a_diff_and_writes_nothing(tree) -> None:
    original = tree.read_bytes()
    run = eval_probe("patch", "--dry-run", str(tree))
    assert run.returncode == 0
    assert run.stdout.startswith("---") and "+    # >>> lm-eval-probe patch " in run.stdout
    assert tree.read_bytes() == original


def test_permission_bits_are_kept(tree) -> None:
    tree.chmod(0o750)
    assert patch_file(tree, payload()).code == 0
    assert stat.S_IMODE(tree.stat().st_mode) == 0o750


@pytest.mark.parametrize(
    ("text", "code", "says"),
    [
        ("#!/bin/bash\necho hello\n", errors.NO_FUNCTION, "expected a function _patch_lm_eval()"),
        ("_patch_lm_eval() {\n    local patch_dir\n}\n", errors.NO_ANCHOR, "found none"),
        (
            "_patch_lm_eval() {\n    cat > \"$patch_dir/sitecustomize.py\" <<'PY'\nx = 1\nPY\n"
            '    export PYTHONPATH="$patch_dir:$PYTHONPATH"\n    export PYTHONPATH="/x:$PYTHONPATH"\n}\n',
            errors.AMBIGUOUS_ANCHOR,
            "found line 5",
        ),
        ('_patch_lm_eval() {\n    export PYTHONPATH="/x"\n', errors.NO_FUNCTION, "never closes"),
    ],
)
def test_fail_soft_cases_leave_the_file_untouched(tmp_path, text: str, code: int, says: str) -> None:
    script = tmp_path / "benchmark_lib.sh"
    script.write_text(text)
    run = eval_probe("patch", str(script))
    assert run.returncode == code
    assert says in run.stderr and "left untouched" in run.stderr
    assert script.read_text() == text


def test_file_problems_get_their_own_message(tmp_path) -> None:
    binary = tmp_path / "binary.sh"
    binary.write_bytes(b"\xff\xfe\x00not utf-8")
    fifo = tmp_path / "fifo.sh"
    os.mkfifo(fifo)  # reading it would block forever
    cases = (
        (tmp_path / "missing.sh", "no such file"), (tmp_path, "is a directory"), (binary, "UTF-8"),
        (fifo, "not a regular file"),
    )  # fmt: skip
    for path, says in cases:
        run = eval_probe("patch", str(path))
        assert run.returncode == errors.FILE_PROBLEM and says in run.stderr


def test_a_result_failing_bash_n_is_not_written(tmp_path) -> None:
    script = tmp_path / "benchmark_lib.sh"
    text = (FIXTURES / "file" / "benchmarks" / "benchmark_lib.sh").read_text() + 'echo "unclosed\n'
    script.write_text(text)
    run = eval_probe("patch", str(script))
    assert run.returncode == errors.BASH_SYNTAX and "bash -n" in run.stderr
    assert script.read_text() == text
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_delimiter_collision_is_refused() -> None:
    with pytest.raises(errors.PatchError) as raised:
        benchlib.block(f"x = 1\n{benchlib.DELIMITER}\ny = 2\n", "9", "ab", "    ", '"$d/sitecustomize.py"')
    assert raised.value.code == errors.DAMAGED_BLOCK
    assert benchlib.DELIMITER not in sitecustomize_text().splitlines()


def test_threads_and_processes_patching_at_once_leave_one_block(tmp_path) -> None:
    shutil.copytree(FIXTURES / "heredoc", tmp_path / "t")
    script = tmp_path / "t" / "benchmarks" / "benchmark_lib.sh"
    procs = [
        subprocess.Popen([PYTHON, "-m", "probe", "patch", str(script)], stdout=subprocess.DEVNULL) for _ in range(4)
    ]
    threads = [threading.Thread(target=patch_file, args=(script, payload())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    assert script.read_text().count(PATCH.end_line) == 1
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_help_explains_exit_codes() -> None:
    run = eval_probe("patch", "--help")
    assert run.returncode == 0 and "6  more than one candidate anchor" in run.stdout
    assert eval_probe("patch").returncode == 64


# A pipeline step that writes sitecustomize.py, then WRAPPED, then the end of _patch_lm_eval.
FUNCTION = """_patch_lm_eval() {
    local patch_dir
    patch_dir="$(mktemp -d)"
    cat > "$patch_dir/sitecustomize.py" <<'PY'
PIPELINE_PATCHED = True
PY
%s
}
"""
EXPORT = "    export PYTHONPATH=$patch_dir:$PYTHONPATH"
# Each wraps the function's only export line in something that is not a command.
WRAPPERS = {
    "unquoted heredoc": f'    cat > "$patch_dir/env.sh" <<EOF\n{EXPORT}\nEOF',
    "quoted heredoc": f"    cat > \"$patch_dir/env.sh\" <<'EOF'\n{EXPORT}\nEOF",
    "double-quoted word": f'    cat > "$patch_dir/env.sh" <<"E"OF\n{EXPORT}\nEOF',
    "tab-stripped heredoc": f'\tcat > "$patch_dir/env.sh" <<-EOF\n{EXPORT}\n\t\tEOF',
    "second heredoc on a line": f"    cat <<A > \"$patch_dir/a\" 3<<'B'\na\nA\n{EXPORT}\nB",
    "single quotes": f"    bash -c '\n{EXPORT}\n'",
    "double quotes": f'    bash -c "\n{EXPORT}\n"',
    "ansi-c quotes": f"    bash -c $'it\\'s\n{EXPORT}\n'",
    "command substitution": f'    env_text="$(cat <<EOF\n{EXPORT}\nEOF\n)"',
    "continued line": f"    true &&\n{EXPORT}",
}


@pytest.mark.parametrize("wrapper", sorted(WRAPPERS))
def test_an_export_that_is_not_a_command_is_never_the_anchor(tmp_path: Path, wrapper: str) -> None:
    script = tmp_path / "benchmark_lib.sh"
    text = FUNCTION % WRAPPERS[wrapper]
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    run = eval_probe("patch", str(script))
    assert run.returncode == errors.NO_ANCHOR, run.stdout + run.stderr
    assert "found none" in run.stderr and "left untouched" in run.stderr
    assert script.read_text() == text


# Every line below that looks like a function, an end, an anchor or a block marker is inside
# a here-document, a string or a comment; the last export is the one real anchor.
DECOYS = r"""
    cat > "$patch_dir/notes.txt" <<EOF
_patch_lm_eval() {
}
export PYTHONPATH=/decoy/unquoted:$HOME
# >>> lm-eval-probe patch v0.0.0 body=0123456789abcdef >>>
EOF
	cat >> "$patch_dir/notes.txt" <<-'TABBED' <<"SECOND"
	export PYTHONPATH=/decoy/tabbed
	}
	TABBED
export PYTHONPATH=/decoy/second
SECOND
    echo 'don'"'"'t # not a comment' $'it\'s' "a # b" ${#patch_dir} $((1 << 2)) >> "$patch_dir/notes.txt"  # it's
    read -r first_word <<< "here string"
    multi='
export PYTHONPATH=/decoy/single
}
'
    export PYTHONPATH="${patch_dir}:${PYTHONPATH:-}"
"""


def test_heredocs_strings_and_comments_never_hold_the_block(tmp_path: Path) -> None:
    script = tmp_path / "benchmark_lib.sh"
    text = FUNCTION % DECOYS.strip("\n")
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    run = eval_probe("patch", str(script))
    assert run.returncode == 0, run.stderr
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    # Source it and call the function, with real bash: the block runs as a command, its quoted
    # heredoc appends the body verbatim (no backtick span of it runs), and the decoys stay data.
    shell = f'source "{script}" && _patch_lm_eval && printf %s "$PYTHONPATH"'
    called = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, env={"PATH": os.environ["PATH"]})
    assert called.returncode == 0 and called.stderr == ""
    site = Path(called.stdout.split(":")[0])
    assert (site / "sitecustomize.py").read_text() == "PIPELINE_PATCHED = True\n" + payload().appended
    assert "/decoy/" not in called.stdout
    assert "export PYTHONPATH=/decoy/second" in (site / "notes.txt").read_text()
    assert eval_probe("patch", "--check", str(script)).returncode == 0
    assert eval_probe("patch", "--unpatch", str(script)).returncode == 0 and script.read_text() == text


@pytest.mark.parametrize(
    "unsure",
    [
        "cat <<EOF\nnever ends\n",  # bash warns and reads to the end of the file
        'x="$(case a in a) echo a;; esac)"\n',
        "cat <<EOF \\\n  | tr a b\nEOF\n",
    ],
)
def test_shell_the_patcher_cannot_follow_is_refused(tmp_path: Path, unsure: str) -> None:
    script = tmp_path / "benchmark_lib.sh"
    text = FUNCTION % '    export PYTHONPATH="${patch_dir}:${PYTHONPATH:-}"' + unsure
    script.write_text(text)
    run = eval_probe("patch", str(script))
    assert run.returncode == errors.UNSURE_SHELL, run.stdout + run.stderr
    assert "refusing rather than guessing" in run.stderr and "left untouched" in run.stderr
    assert script.read_text() == text


def test_a_symlinked_script_is_patched_through_the_link(tree, tmp_path: Path) -> None:
    link_dir = tmp_path / "links"
    link_dir.mkdir()
    link = link_dir / "benchmark_lib.sh"
    link.symlink_to(tree)
    original = tree.read_text()
    assert eval_probe("patch", str(link)).returncode == 0
    assert link.is_symlink() and link.resolve() == tree.resolve()
    assert PATCH.end_line in tree.read_text()
    assert eval_probe("patch", "--check", str(link)).returncode == 0
    assert eval_probe("patch", "--unpatch", str(link)).returncode == 0
    assert link.is_symlink() and tree.read_text() == original
    assert sorted(p.name for p in link_dir.iterdir()) == ["benchmark_lib.sh"]
    dangling = link_dir / "dangling.sh"
    dangling.symlink_to(tmp_path / "nowhere.sh")
    run = eval_probe("patch", str(dangling))
    assert run.returncode == errors.FILE_PROBLEM and "no such file" in run.stderr
    assert not (tmp_path / "nowhere.sh").exists()


def test_a_hand_edited_block_is_not_current_and_patch_restores_it(tree) -> None:
    assert patch_file(tree, payload()).code == 0
    patched = tree.read_text()
    edited = patched.replace("def _lm_eval_probe_start(origin):", "def _lm_eval_probe_start(origin):  # mine", 1)
    assert edited != patched
    tree.write_text(edited)
    check = eval_probe("patch", "--check", str(tree))
    assert check.returncode == errors.NOT_CURRENT and "edited" in check.stdout
    run = eval_probe("patch", str(tree))
    assert run.returncode == 0 and "edited" in run.stdout
    assert tree.read_text() == patched
    assert eval_probe("patch", "--check", str(tree)).returncode == 0


def test_patching_leaves_no_lock_file_and_never_follows_a_planted_one(tree, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = tree.with_name(tree.name + ".lock")
    planted.symlink_to(outside / "victim")
    before = sorted(p.name for p in tree.parent.iterdir())
    run = eval_probe("patch", str(tree))
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in tree.parent.iterdir()) == before  # nothing left behind
    assert list(outside.iterdir()) == []  # nothing written through the planted link
    planted.unlink()
    assert eval_probe("patch", "--unpatch", str(tree)).returncode == 0
    assert sorted(p.name for p in tree.parent.iterdir()) == sorted(set(before) - {planted.name})


def shared_copy(tmp_path: Path) -> Path:
    """The heredoc fixture in a directory every user may enter; returns its benchmark_lib.sh."""
    directory = tmp_path / "shared"
    shutil.copytree(FIXTURES / "heredoc" / "benchmarks", directory)
    for path in (tmp_path, directory):
        path.chmod(0o755)
    return directory / "benchmark_lib.sh"


def test_a_read_only_directory_is_a_file_problem(tmp_path: Path) -> None:
    script = shared_copy(tmp_path)
    original = script.read_text()
    script.parent.chmod(0o555)
    try:
        run = subprocess.run(
            [*unprivileged(), PYTHON, "-m", "probe", "patch", str(script)], capture_output=True, text=True, timeout=120
        )
    finally:
        script.parent.chmod(0o755)
    assert run.returncode == errors.FILE_PROBLEM, run.stderr
    assert "cannot write" in run.stderr and "Traceback" not in run.stderr
    assert script.read_text() == original


def test_the_owner_is_kept_or_nothing_is_written(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file owned by another user")
    script = shared_copy(tmp_path)
    original = script.read_text()
    os.chown(script, 1234, 1234)
    # Without the right to give a file away, keeping the owner is impossible: refuse.
    run = subprocess.run(
        [*unprivileged(), PYTHON, "-m", "probe", "patch", str(script)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == errors.FILE_PROBLEM and "owner" in run.stderr, run.stdout + run.stderr
    assert script.read_text() == original and (script.stat().st_uid, script.stat().st_gid) == (1234, 1234)
    assert eval_probe("patch", str(script)).returncode == 0
    assert PATCH.end_line in script.read_text() and (script.stat().st_uid, script.stat().st_gid) == (1234, 1234)
