"""A memo of lm-eval's task index, for the test environments only.

Every lm-eval run reads all of its built-in task files (about 14,000 YAML files) to index them
before it looks at the task it was asked for: 7-15 s of a core per run on this project's machines,
most of a whole lm-eval run in these tests, and nothing the probe touches. scripts/test.sh writes a
``.pth`` file into each test environment that runs this file at interpreter start-up
(``start``) when ``LM_EVAL_PROBE_TASK_INDEX_MEMO`` names a directory. From then on, what lm-eval's
own indexing reads from its built-in task files is kept in that directory, one file per lm-eval
installation and state of its task files (named by the installation's RECORD, which hashes every
file it installed, and by the name, size and modification time of every file under its task
directory now, so that a file edited, added or removed after installing is read again), and
later runs get a fresh copy of it instead of parsing the files again:

- lm-eval 0.4.12 and later: each built-in YAML file as ``lm_eval.tasks._index.load_yaml`` parses
  it for the index (``resolve_func=False``); lm-eval's own code still builds the index from them.
- 0.4.9.2 and InferenceX's b315ef3: what ``TaskManager._get_task_and_group`` makes of the
  built-in task directory (names, kinds and paths: plain data).

Each answer is kept for the working directory it was read in, as its entries were then: 0.4.9.2
and b315ef3 look for a relative ``include:`` there first (a working directory that cannot be had,
removed, memoizes nothing). Task files outside lm-eval's own directory (every test's own
task), any other call, and an installation without a RECORD beside it (an editable one) go to
lm-eval untouched. Not seen: a task file rewritten with its size and modification time kept (as
``cp -p`` copies), a file of the working directory rewritten in place (its directory's time stays),
or changed after ``lm_eval.tasks`` was imported in the process that indexes. Standard
library only, and it never breaks a run: a failure of its own leaves lm-eval to do the work.
``tests/test_task_index_memo.py`` checks that the index built from the memo is lm-eval's own.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False  # typing is not imported at start-up: this runs in every test interpreter
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

VARIABLE = "LM_EVAL_PROBE_TASK_INDEX_MEMO"
FORMAT = "1"  # in every memo file's name: a new format never reads an old file


class TaskIndexMemo:
    """A meta-path finder that memoizes lm-eval's task indexing once ``lm_eval.tasks`` has run;
    it also holds the memo and counts what it answered (``hits``) and what lm-eval read
    (``misses``)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.done = False
        self.hits = 0
        self.misses = 0
        self.file = ""  # the memo file of this lm-eval installation; "" where there is none
        self.blobs: dict[tuple, bytes] | None = None  # read on first use
        self.dirty = False

    # -- waiting for lm_eval.tasks ----------------------------------------------------------
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if self.done or fullname != "lm_eval.tasks":
            return None
        self.done = True  # stays in sys.meta_path: removing itself would skip the next finder
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if finder is not self and find else None
            if spec is not None and spec.loader is not None:
                self.install_after(spec.loader)
                return spec
        return None

    def install_after(self, loader: Any) -> None:
        """Have ``loader`` run ``install`` on the module once it has executed it."""
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            import contextlib

            with contextlib.suppress(Exception):  # lm-eval then indexes as it always does
                self.install(module)

        loader.exec_module = exec_module

    def install(self, tasks: Any) -> None:
        """Wrap the indexing function of the lm-eval ``tasks`` package just imported."""
        builtin = os.path.dirname(os.path.abspath(tasks.__file__))
        self.file = self.memo_file(builtin)
        if not self.file:
            return
        index = sys.modules.get("lm_eval.tasks._index")
        manager = getattr(tasks, "TaskManager", None)
        if index is not None and callable(getattr(index, "load_yaml", None)):
            index.load_yaml = self.per_file(index.load_yaml, builtin)
        elif callable(getattr(manager, "_get_task_and_group", None)):
            manager._get_task_and_group = self.per_directory(manager._get_task_and_group, builtin)

    def memo_file(self, builtin: str) -> str:
        """This installation's memo file: named by the one RECORD beside the package and the
        task files as they are now (``files_now``), hashed with this format and the Python; ""
        where there is no such RECORD."""
        import glob
        import hashlib

        site = os.path.dirname(os.path.dirname(builtin))
        records = glob.glob(os.path.join(glob.escape(site), "lm_eval-*.dist-info", "RECORD"))
        if len(records) != 1:
            return ""
        digest = hashlib.sha256(f"{FORMAT}\0{sys.version}\0{builtin}\0".encode())
        with open(records[0], "rb") as record:
            digest.update(record.read())
        digest.update(files_now(builtin))
        return os.path.join(self.directory, f"{digest.hexdigest()[:32]}.pickle")

    # -- the two ways lm-eval indexes ---------------------------------------------------------
    def per_file(self, load_yaml: Callable[..., Any], builtin: str) -> Callable[..., Any]:
        """``load_yaml`` (0.4.12 and later), memoized for the index's reading of a built-in file."""
        inside = builtin + os.sep

        def load_yaml_memoized(path: Any, *args: Any, **kwargs: Any) -> Any:
            # Spelled as lm-eval spells it, a path through ".." may lead out of the directory.
            name = os.path.normpath(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else ""
            if (
                args
                or kwargs.get("resolve_func", True) is not False
                or not set(kwargs)
                <= {
                    "resolve_func",
                    "recursive",
                }
            ):
                name = ""
            if not name.startswith(inside):
                return load_yaml(path, *args, **kwargs)
            here = working_directory()
            if here is None:
                return load_yaml(path, *args, **kwargs)
            key = ("file", name, bool(kwargs.get("recursive", True)), here)
            return self.answer(key, load_yaml, path, *args, **kwargs)

        load_yaml_memoized.__wrapped__ = load_yaml  # type: ignore[attr-defined]
        return load_yaml_memoized

    def per_directory(self, get: Callable[..., Any], builtin: str) -> Callable[..., Any]:
        """``TaskManager._get_task_and_group`` (0.4.9.2, b315ef3), memoized for the built-in
        task directory."""

        def _get_task_and_group_memoized(manager: Any, task_dir: Any, *args: Any, **kwargs: Any) -> Any:
            here = working_directory()
            if here is None or args or kwargs or os.path.normpath(os.fspath(task_dir)) != builtin:
                return get(manager, task_dir, *args, **kwargs)
            return self.answer(("directory", here), get, manager, task_dir)

        _get_task_and_group_memoized.__wrapped__ = get  # type: ignore[attr-defined]
        return _get_task_and_group_memoized

    # -- the memo -----------------------------------------------------------------------------
    def answer(self, key: tuple, compute: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A fresh copy of what ``compute`` gave for ``key`` before, or what it gives now
        (kept for later: written to the memo file when this process exits)."""
        import pickle

        try:
            blobs = self.loaded()
            if key in blobs:
                value = pickle.loads(blobs[key])
                self.hits += 1
                return value
        except Exception:
            pass
        value = compute(*args, **kwargs)
        self.misses += 1
        try:
            blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            return value  # not plain data: lm-eval reads it every time
        self.loaded()[key] = blob
        if not self.dirty:
            import atexit

            self.dirty = True
            atexit.register(self.save)
        return value

    def loaded(self) -> dict[tuple, bytes]:
        if self.blobs is None:
            self.blobs = self.read()
        return self.blobs

    def read(self) -> dict[tuple, bytes]:
        import pickle
        import stat

        try:
            # Not blocking on a FIFO, nor reading a device: only a regular file is a memo.
            with open(os.open(self.file, os.O_RDONLY | os.O_NONBLOCK), "rb") as memo:
                if not stat.S_ISREG(os.fstat(memo.fileno()).st_mode):
                    return {}
                blobs = pickle.load(memo)
        except Exception:
            return {}  # none yet, or unreadable: lm-eval reads the files, and the memo is written anew
        return blobs if isinstance(blobs, dict) else {}

    def save(self) -> None:
        """Write the memo (what another process wrote meanwhile kept too), atomically."""
        import pickle
        import tempfile

        try:
            blobs = {**self.read(), **self.loaded()}
            os.makedirs(self.directory, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            try:
                with os.fdopen(handle, "wb") as memo:
                    pickle.dump(blobs, memo, protocol=pickle.HIGHEST_PROTOCOL)
                os.replace(temporary, self.file)
            finally:
                if os.path.exists(temporary):
                    os.remove(temporary)
        except Exception:
            pass  # a later run writes it


def working_directory() -> tuple[str, int] | None:
    """The working directory and the time its entries last changed (a file named like a relative
    include put there or taken away), or None when it cannot be had (removed): nothing is memoized."""
    try:
        return os.getcwd(), os.stat(".").st_mtime_ns
    except OSError:
        return None


def files_now(builtin: str) -> bytes:
    """The relative name, size and modification time of every file under ``builtin`` (bytecode
    caches left out: a run that writes them changes no task), in a canonical order. About 0.1 s
    for lm-eval's 15,000 files (scandir: no path arithmetic per file)."""
    entries = []
    directories = [("", builtin)]
    while directories:
        prefix, directory = directories.pop()
        with os.scandir(directory) as found:
            for entry in found:
                if not entry.is_dir(follow_symlinks=False):
                    about = entry.stat()
                    entries.append(f"{prefix}{entry.name}\0{about.st_size}\0{about.st_mtime_ns}")
                elif entry.name != "__pycache__":
                    directories.append((f"{prefix}{entry.name}/", entry.path))
    entries.sort()
    return "\n".join(entries).encode("utf-8", "surrogateescape")


def start(directory: str) -> TaskIndexMemo:
    """Memoize lm-eval's task indexing in this process, into ``directory``; once per process."""
    for finder in sys.meta_path:
        if type(finder).__name__ == TaskIndexMemo.__name__:
            return finder  # type: ignore[return-value]
    memo = TaskIndexMemo(os.path.abspath(directory))
    sys.meta_path.insert(0, memo)
    return memo


def pth_line(source: str) -> str:
    """The line of a ``.pth`` file that runs ``source`` (this file) and ``start`` at interpreter
    start-up while the variable names a directory."""
    code = f"compile(open({source!r}, encoding='utf-8').read(), {source!r}, 'exec')"
    return f"import os; os.environ.get({VARIABLE!r}) and exec({code}, {{'__name__': 'task_index_memo'}})\n"


if __name__ == "task_index_memo":  # run by the .pth line
    start(os.environ[VARIABLE])
