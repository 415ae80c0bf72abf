"""The test environments' memo of lm-eval's task index (tests/support/task_index_memo.py): the
index lm-eval builds from it is the one it builds by reading its files, and a memo that is
missing, unreadable or of another installation only means that lm-eval reads them again."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from support import task_index_memo
from support.procs import PYTHON

SOURCE = str(Path(task_index_memo.__file__).resolve())

# A child that builds lm-eval's task index twice (the memo, on first use, is filled by lm-eval's
# own reading of its files, then serves the second) and prints both, canonically, with what the
# memo did after each.
CHILD = """
import dataclasses, json, os, sys
exec(compile(open(SOURCE, encoding="utf-8").read(), SOURCE, "exec"), {"__name__": "task_index_memo"})
memo = next(f for f in sys.meta_path if type(f).__name__ == "TaskIndexMemo")  # as the .pth line does
from lm_eval.tasks import TaskManager

def canonical(value):
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)

builds = []
for _ in range(2):
    index = json.dumps(TaskManager().task_index, sort_keys=True, default=canonical)
    builds.append({"index": index, "hits": memo.hits, "misses": memo.misses})
print(json.dumps(builds))
""".replace("SOURCE", repr(SOURCE))


def index_built(memo: Path) -> list[dict]:
    """What a child building lm-eval's task index twice, with the memo in ``memo``, saw."""
    env = {**os.environ, task_index_memo.VARIABLE: str(memo)}
    child = subprocess.run([PYTHON, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.splitlines()[-1])


@pytest.mark.slow
def test_the_index_built_from_the_memo_is_the_one_lm_eval_builds_from_its_files(tmp_path: Path) -> None:
    memo = tmp_path / "memo"
    read, served = index_built(memo)  # lm-eval reads every built-in file; then the memo answers
    assert read["hits"] == 0 and read["misses"] > 0
    assert served["misses"] == read["misses"] and served["hits"] == read["misses"]
    assert len(json.loads(read["index"])) > 1000  # lm-eval's own tasks, not an empty index
    assert served["index"] == read["index"]
    assert len(list(memo.glob("*.pickle"))) == 1, "the memo was not written when the process ended"
    from_file, _ = index_built(memo)  # another process: the memo file answers every question
    assert from_file["misses"] == 0 and from_file["hits"] == read["misses"]
    assert from_file["index"] == read["index"]


def fake_installation(site: Path, record: bytes) -> Path:
    """A site directory with an lm_eval package's tasks directory and a RECORD beside it."""
    tasks = site / "lm_eval" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "__init__.py").write_text("")
    info = site / "lm_eval-9.9.dist-info"
    info.mkdir()
    (info / "RECORD").write_bytes(record)
    return tasks


@pytest.mark.release_independent
def test_each_installation_has_its_own_memo_and_one_without_a_record_has_none(tmp_path: Path) -> None:
    memo = task_index_memo.TaskIndexMemo(str(tmp_path / "memo"))
    one = fake_installation(tmp_path / "one", b"a")
    other = fake_installation(tmp_path / "other", b"a")
    changed = fake_installation(tmp_path / "changed", b"b")
    names = {memo.memo_file(str(tasks)) for tasks in (one, other, changed)}
    assert len(names) == 3 and "" not in names
    before = memo.memo_file(str(changed))
    (tmp_path / "changed" / "lm_eval-9.9.dist-info" / "RECORD").write_bytes(b"a")  # reinstalled
    assert memo.memo_file(str(changed)) not in (before, "")
    (tmp_path / "one" / "lm_eval-9.9.dist-info" / "RECORD").unlink()
    assert memo.memo_file(str(one)) == ""  # an editable install, say: lm-eval reads its files


@pytest.mark.release_independent
def test_only_the_indexs_reading_of_built_in_files_is_memoized(tmp_path: Path) -> None:
    memo = task_index_memo.TaskIndexMemo(str(tmp_path / "memo"))
    builtin = str(fake_installation(tmp_path / "site", b"r"))
    memo.file = memo.memo_file(builtin)
    read: list[tuple] = []

    def load_yaml(path: object, **kwargs: object) -> dict:
        read.append((str(path), kwargs))
        return {"task": str(path), "seen": len(read)}

    load = memo.per_file(load_yaml, builtin)
    inside, outside = f"{builtin}/a/x.yaml", str(tmp_path / "x.yaml")
    assert load(inside, resolve_func=False) == load(inside, resolve_func=False) == {"task": inside, "seen": 1}
    assert load(Path(inside), resolve_func=False, recursive=False)["seen"] == 2  # another question
    load(outside, resolve_func=False), load(outside, resolve_func=False)  # a test's own task file
    load(inside), load(inside, resolve_func=True)  # resolving functions: a task being loaded
    assert [path for path, _ in read] == [inside, inside, outside, outside, inside, inside]
    assert memo.hits == 1

    copy = load(inside, resolve_func=False)
    copy["task"] = "changed by lm-eval"
    assert load(inside, resolve_func=False)["task"] == inside  # each answer is a fresh copy


@pytest.mark.release_independent
def test_what_cannot_be_kept_is_computed_every_time(tmp_path: Path) -> None:
    memo = task_index_memo.TaskIndexMemo(str(tmp_path / "memo"))
    builtin = str(fake_installation(tmp_path / "site", b"r"))
    memo.file = memo.memo_file(builtin)
    calls = []

    def get(manager: object, task_dir: str) -> dict:
        calls.append(task_dir)
        return {"t": lambda: None}  # a function: no plain data

    get_memoized = memo.per_directory(get, builtin)
    get_memoized(None, builtin + "/"), get_memoized(None, builtin)
    assert calls == [builtin + "/", builtin] and memo.hits == 0
    memo.save()
    assert not Path(memo.file).exists() or memo.read() == {}


@pytest.mark.release_independent
def test_an_unreadable_memo_is_read_past_and_written_anew(tmp_path: Path) -> None:
    builtin = str(fake_installation(tmp_path / "site", b"r"))
    read: list[str] = []

    def load_yaml(path: str, **kwargs: object) -> dict:
        read.append(path)
        return {"task": path}

    def process(memo_file_text: bytes | None = None) -> task_index_memo.TaskIndexMemo:
        memo = task_index_memo.TaskIndexMemo(str(tmp_path / "memo"))
        memo.file = memo.memo_file(builtin)
        if memo_file_text is not None:
            Path(memo.file).write_bytes(memo_file_text)
        load = memo.per_file(load_yaml, builtin)
        assert load(f"{builtin}/x.yaml", resolve_func=False) == {"task": f"{builtin}/x.yaml"}
        memo.save()  # as the process ends
        return memo

    assert process().misses == 1
    assert process().hits == 1
    assert process(b"not a pickle").misses == 1
    assert process(b"\x80\x05N.").misses == 1  # a pickle, but not a memo
    assert process().hits == 1  # written anew
    assert len(read) == 3


@pytest.mark.release_independent
def test_a_task_file_changed_after_installing_makes_another_memo(tmp_path: Path) -> None:
    """The RECORD says what was installed, not what is there now: a task file edited, added or
    removed since names another memo (lm-eval reads its files again); bytecode written does not."""
    memo = task_index_memo.TaskIndexMemo(str(tmp_path / "memo"))
    tasks = fake_installation(tmp_path / "site", b"r")
    (tasks / "gsm8k").mkdir()
    task_file = tasks / "gsm8k" / "gsm8k.yaml"
    task_file.write_text("task: gsm8k\n")
    names = [memo.memo_file(str(tasks))]
    (tasks / "__pycache__").mkdir()
    (tasks / "__pycache__" / "__init__.cpython-313.pyc").write_bytes(b"bytecode")
    assert memo.memo_file(str(tasks)) == names[0]  # a run compiled the package: no task changed
    written = task_file.stat().st_mtime_ns
    task_file.write_text("task: gsm8x\n")  # the same size: the time tells
    os.utime(task_file, ns=(written + 10**9, written + 10**9))
    names.append(memo.memo_file(str(tasks)))
    task_file.write_text("task: gsm8k_edited\n")  # the same time: the size tells
    os.utime(task_file, ns=(written + 10**9, written + 10**9))
    names.append(memo.memo_file(str(tasks)))
    (tasks / "gsm8k" / "gsm8k_cot.yaml").write_text("task: gsm8k_cot\n")
    names.append(memo.memo_file(str(tasks)))
    task_file.unlink()
    names.append(memo.memo_file(str(tasks)))
    assert len(set(names)) == 5 and "" not in names


@pytest.mark.release_independent
def test_a_path_that_leads_out_of_the_task_directory_is_not_memoized(tmp_path: Path) -> None:
    """A user's include path spelled through lm-eval's own directory (tasks/../../mine) names
    a file outside it: lm-eval reads it every time, whatever the spelling."""
    memo = task_index_memo.TaskIndexMemo(str(tmp_path / "memo"))
    builtin = str(fake_installation(tmp_path / "site", b"r"))
    memo.file = memo.memo_file(builtin)
    mine = tmp_path / "site" / "mine.yaml"
    mine.write_text("task: mine\n")
    read: list[str] = []

    def load_yaml(path: object, **kwargs: object) -> str:
        read.append(str(path))
        return Path(path).read_text()  # type: ignore[arg-type]

    load = memo.per_file(load_yaml, builtin)
    through = f"{builtin}/../../mine.yaml"
    assert load(through, resolve_func=False) == "task: mine\n"
    mine.write_text("task: mine_edited\n")
    assert load(through, resolve_func=False) == "task: mine_edited\n" and memo.hits == 0
    get = memo.per_directory(lambda manager, task_dir: {"read": task_dir}, builtin)
    assert get(None, f"{builtin}/../tasks") == {"read": f"{builtin}/../tasks"} and memo.misses == 1
    assert get(None, f"{builtin}/x/..") == {"read": f"{builtin}/../tasks"} and memo.hits == 1  # the same one


@pytest.mark.release_independent
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_memo_path_that_is_no_regular_file_is_read_past_at_once(tmp_path: Path, kind: str) -> None:
    """A FIFO (or a directory) where the memo file should be: reading it neither blocks nor fails
    the run; lm-eval reads its files."""
    memo = task_index_memo.TaskIndexMemo(str(tmp_path / "memo"))
    memo.file = memo.memo_file(str(fake_installation(tmp_path / "site", b"r")))
    os.makedirs(memo.directory)
    os.mkfifo(memo.file) if kind == "fifo" else os.mkdir(memo.file)
    found: list[dict] = []
    reader = threading.Thread(target=lambda: found.append(memo.read()), daemon=True)
    reader.start()
    reader.join(timeout=30)
    assert found == [{}], "reading the memo blocked"


@pytest.mark.release_independent
def test_an_answer_is_kept_for_the_working_directory_it_was_read_in(tmp_path: Path, monkeypatch) -> None:
    """0.4.9.2 and b315ef3 look for a relative include in the working directory first: what
    was read in one is never served in another."""
    memo = task_index_memo.TaskIndexMemo(str(tmp_path / "memo"))
    builtin = str(fake_installation(tmp_path / "site", b"r"))
    memo.file = memo.memo_file(builtin)
    get = memo.per_directory(lambda manager, task_dir: {"read in": os.getcwd()}, builtin)
    load = memo.per_file(lambda path, **kwargs: {"read in": os.getcwd()}, builtin)
    for there in (tmp_path / "a", tmp_path / "b"):
        there.mkdir()
        monkeypatch.chdir(there)
        for _ in range(2):
            assert get(None, builtin) == {"read in": str(there)}
            assert load(f"{builtin}/x.yaml", resolve_func=False) == {"read in": str(there)}
    assert (memo.misses, memo.hits) == (4, 4)
    before = there.stat().st_mtime_ns
    (there / "_template_yaml").write_text("tag: planted\n")  # a file lm-eval may include from here
    os.utime(there, ns=(before + 10**9, before + 10**9))  # later (a clock tick may hold both times)
    assert get(None, builtin) == {"read in": str(there)} and memo.misses == 5


@pytest.mark.release_independent
def test_a_working_directory_that_is_gone_memoizes_nothing_and_breaks_nothing(tmp_path: Path, monkeypatch) -> None:
    memo = task_index_memo.TaskIndexMemo(str(tmp_path / "memo"))
    builtin = str(fake_installation(tmp_path / "site", b"r"))
    memo.file = memo.memo_file(builtin)
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    load = memo.per_file(lambda path, **kwargs: {"read": str(path)}, builtin)
    get = memo.per_directory(lambda manager, task_dir: {"read": task_dir}, builtin)
    for _ in range(2):
        assert load(f"{builtin}/x.yaml", resolve_func=False) == {"read": f"{builtin}/x.yaml"}
        assert get(None, builtin) == {"read": builtin}
    assert (memo.hits, memo.misses) == (0, 0)
